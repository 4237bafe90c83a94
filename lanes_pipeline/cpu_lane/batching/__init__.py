"""Talking to llama-server (ik_llama.cpp or upstream): the client, and batches that are slot-bounded,
cached by content, resumable, warmed by a shared prefix and spread over endpoints. Knows HTTP, not Dagster,
and nothing of the jobs above it."""

"""Dagster resources, one per file: each wraps a lane client or the artifact store."""

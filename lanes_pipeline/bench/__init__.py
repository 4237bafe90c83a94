"""Benchmarks (`make bench`): each module here exposes `run(settings) -> dict` and is measured side by
side in one run; `python -m lanes_pipeline.bench` writes data/bench/report.json and report.md."""

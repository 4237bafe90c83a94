"""The GPU lane's trainer, run in its own process (`python -m lanes_pipeline.training`); no Dagster here."""

"""The GPU lane's trainer, run in its own process (`python -m lanes_pipeline.gpu_lane.training`)."""

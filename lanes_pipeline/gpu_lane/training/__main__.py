"""`python -m lanes_pipeline.gpu_lane.training train|eval SPEC.json`: progress through Dagster Pipes when an
asset launched it, else as JSON lines on stdout."""

import sys

from lanes_pipeline.gpu_lane.training.trainer import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

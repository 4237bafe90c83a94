"""`python -m lanes_pipeline.gpu_lane.training train|eval SPEC.json`: progress as JSON lines on stdout."""

import sys

from lanes_pipeline.gpu_lane.training.trainer import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

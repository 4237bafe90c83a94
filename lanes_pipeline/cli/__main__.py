"""`python -m lanes_pipeline.cli`: the same as the `lanes` console script."""

from lanes_pipeline.cli import main

main()

"""The `lanes` command. Each area adds its own click group in its own module of this package."""

from __future__ import annotations

import click

from lanes_pipeline.cli.adapters import adapters
from lanes_pipeline.cli.backfill import backfill
from lanes_pipeline.cli.config import config
from lanes_pipeline.cli.cpu import cpu
from lanes_pipeline.cli.dev import dev
from lanes_pipeline.cli.export import export
from lanes_pipeline.cli.report import report
from lanes_pipeline.cli.run import run
from lanes_pipeline.cli.serve import serve
from lanes_pipeline.cli.service import service
from lanes_pipeline.cli.setup import setup
from lanes_pipeline.cli.trial import bench, trial


@click.group()
def main() -> None:
    """lanes_pipeline: CPU-lane batch work feeding daily LoRA adapters for the GPU lane."""


for command in (
    config,
    setup,
    serve,
    run,
    dev,
    backfill,
    cpu,
    adapters,
    trial,
    bench,
    report,
    service,
    export,
):
    main.add_command(command)

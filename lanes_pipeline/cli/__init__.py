"""The `lanes` command. Each area adds its own click group in its own module of this package."""

from __future__ import annotations

import click

from lanes_pipeline.cli.config import config
from lanes_pipeline.cli.dev import dev
from lanes_pipeline.cli.run import run
from lanes_pipeline.cli.serve import serve
from lanes_pipeline.cli.setup import setup


@click.group()
def main() -> None:
    """lanes_pipeline: CPU-lane batch work feeding daily LoRA adapters for the GPU lane."""


main.add_command(config)
main.add_command(serve)
main.add_command(run)
main.add_command(setup)
main.add_command(dev)

try:  # areas that land later register here
    from lanes_pipeline.cli.cpu import cpu

    main.add_command(cpu)
except ImportError:  # pragma: no cover - only while the CPU-lane CLI is absent
    pass
try:
    from lanes_pipeline.cli.adapters import adapters

    main.add_command(adapters)
except ImportError:  # pragma: no cover
    pass

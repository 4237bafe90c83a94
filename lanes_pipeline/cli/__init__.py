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
from lanes_pipeline.cli.status import LANE_DOWN_EXIT, status
from lanes_pipeline.cli.trial import bench, trial

# What a script can read from `$?`; the top-level --help shows it (\b keeps click from rewrapping it).
EXIT_CODES = f"""\b
Exit codes:
  0    done
  1    failed: the message says what and where (a bad setting, a lane error, a failed run)
  2    the command line is wrong (an unknown option, a missing argument)
  {LANE_DOWN_EXIT}    `lanes status`: a lane is down (the status is printed all the same)
  130  stopped by Ctrl-C, SIGTERM or SIGHUP (what the command started is stopped too)"""


# help_option_names reaches every subcommand: their contexts inherit it from this one.
@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.version_option(package_name="lanes_pipeline", prog_name="lanes")
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
    status,
):
    main.add_command(command)

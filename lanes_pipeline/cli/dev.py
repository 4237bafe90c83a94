"""`lanes dev`: the lanes plus the `dagster dev` UI (webserver and daemon: schedule, backfills, run queue,
run monitoring) on the project's persistent instance."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import click

from lanes_pipeline.daily.instance import prepare_instance, use_project_instance
from lanes_pipeline.embedded.servers import running_lanes
from lanes_pipeline.errors import LaneError
from lanes_pipeline.settings import ConfigError, load_settings


@click.command()
@click.option("--port", default=3000, show_default=True, help="port of the Dagster UI")
def dev(port: int) -> None:
    """Start the lanes, then `dagster dev` (Ctrl-C stops the UI, then the lanes)."""
    try:
        settings = load_settings()
        home = use_project_instance(settings)
        _instance, limits, released = prepare_instance(settings)
        with running_lanes(settings) as endpoints:
            pools = ", ".join(f"{pool} {limit}" for pool, limit in sorted(limits.items()))
            click.echo(
                f"cpu_lane: {endpoints.cpu_url}\ngpu_lane: {endpoints.gpu_url}\nDAGSTER_HOME: {home}\n"
                f"pool limits: {pools}"
            )
            for run_id in released:
                click.echo(f"run {run_id} had died holding pool slots: marked failed, slots freed")
            command = [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port)]
            with contextlib.suppress(KeyboardInterrupt):
                subprocess.run(command, cwd=settings.project_root, check=False)
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None

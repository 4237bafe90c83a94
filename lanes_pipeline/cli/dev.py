"""`lanes dev`: the lanes plus the `dagster dev` UI (webserver and daemon: schedule, backfills, run queue,
run monitoring) on the project's persistent instance. Ctrl-C, SIGTERM or SIGHUP stop it all: the UI's process
group first (webserver, daemon, code servers, the runs they launched), then the lanes."""

from __future__ import annotations

import contextlib
import sys

import click

from lanes_pipeline.cli.stopping import child_group, stop_like_ctrl_c
from lanes_pipeline.deploy.instance import prepare_instance, use_project_instance
from lanes_pipeline.embedded.servers import running_lanes
from lanes_pipeline.errors import LaneError
from lanes_pipeline.settings import ConfigError, load_settings

# `dagster dev` stops its webserver and daemon when interrupted (it allows each up to 60 s); what is still
# running after this long is killed with its process group.
UI_STOP_GRACE_S = 30.0


@click.command()
@click.option("--port", default=3000, show_default=True, help="port of the Dagster UI")
def dev(port: int) -> None:
    """Start the lanes, then `dagster dev` (Ctrl-C, SIGTERM or SIGHUP stops the UI, then the lanes)."""
    stop_like_ctrl_c()
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
            with (
                contextlib.suppress(KeyboardInterrupt),
                child_group(command, cwd=settings.project_root, grace_s=UI_STOP_GRACE_S) as ui,
            ):
                ui.wait()
            click.echo("stopping lanes...", err=True)
    except KeyboardInterrupt:  # while a lane was starting: the ones started are stopped already
        click.echo("interrupted; lanes stopped", err=True)
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None

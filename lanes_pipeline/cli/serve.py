"""`lanes serve cpu|gpu|all`: start the embedded (or check the external) lanes and keep them up until
Ctrl-C, SIGTERM or SIGHUP, then stop them cleanly."""

from __future__ import annotations

import click

from lanes_pipeline.cli.stopping import sleep_unless_stopped, stop_like_ctrl_c
from lanes_pipeline.embedded.servers import LaneName, running_lanes
from lanes_pipeline.errors import LaneError
from lanes_pipeline.settings import ConfigError, load_settings

WHICH: dict[str, tuple[LaneName, ...]] = {"cpu": ("cpu",), "gpu": ("gpu",), "all": ("cpu", "gpu")}


@click.command()
@click.argument("which", type=click.Choice(sorted(WHICH)), default="all")
def serve(which: str) -> None:
    """Start the lanes, print their URLs, and stop them on Ctrl-C / SIGTERM / SIGHUP."""
    # SIGTERM and SIGHUP unwind like Ctrl-C, also while a server is still starting, so running_lanes'
    # cleanup stops every server it started: no orphans.
    stop_like_ctrl_c()
    try:
        settings = load_settings()
        with running_lanes(settings, WHICH[which]) as endpoints:
            for lane in WHICH[which]:
                click.echo(f"{lane}_lane: {endpoints.url(lane)}", color=False)
            click.echo("lanes are up; Ctrl-C stops them", err=True)
            try:
                sleep_unless_stopped()
            except KeyboardInterrupt:
                click.echo("stopping lanes...", err=True)
    except KeyboardInterrupt:
        click.echo("interrupted; lanes stopped", err=True)
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None

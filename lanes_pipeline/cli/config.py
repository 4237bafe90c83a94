"""`lanes config check|show`: validate every config file; print each bad value with file, key and reason."""

from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import fields
from pathlib import Path

import click

from lanes_pipeline.gpu_lane.adapters import local_side_problem
from lanes_pipeline.settings import ConfigError, ConfigIssue, load_settings


@click.group()
def config() -> None:
    """Validate and show the configuration (configs/ or $LANES_CONFIG_DIR)."""


_DIR = click.option(
    "--dir",
    "config_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="config folder (default: $LANES_CONFIG_DIR or ./configs)",
)


@config.command()
@_DIR
def check(config_dir: Path | None) -> None:
    """Exit 1 and list every problem if any config value is bad."""
    try:
        settings = load_settings(config_dir)
    except ConfigError as exc:
        for issue in exc.issues:
            click.echo(str(issue), err=True)
        click.echo(f"{len(exc.issues)} problem(s) found", err=True)
        raise SystemExit(1) from None
    # Beyond the files' own values: what they name on this machine must exist.
    problem = local_side_problem(settings.lanes.gpu_lane.adapter_paths)
    if problem is not None:
        lanes_file = settings.config_dir / "lanes.yaml"
        with suppress(ValueError):  # as the other messages say it: relative to the working folder if inside
            lanes_file = lanes_file.resolve().relative_to(Path.cwd().resolve())
        issue = ConfigIssue(str(lanes_file), "gpu_lane.adapter_paths.local", problem)
        click.echo(str(issue), err=True)
        click.echo("1 problem(s) found", err=True)
        raise SystemExit(1)
    click.echo(f"{settings.config_dir}: all config files are valid")


@config.command()
@_DIR
def show(config_dir: Path | None) -> None:
    """Print the validated configuration, defaults filled in, as JSON."""
    try:
        settings = load_settings(config_dir)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    shown = {f.name: getattr(settings, f.name) for f in fields(settings) if f.name != "config_dir"}
    click.echo(json.dumps({k: v.model_dump(mode="json") for k, v in shown.items()}, indent=2))

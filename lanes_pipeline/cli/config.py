"""`lanes config check|show`: validate every config file; print each bad value with file, key and reason."""

from __future__ import annotations

import json
import os
from contextlib import suppress
from dataclasses import fields
from pathlib import Path

import click

from lanes_pipeline.cpu_lane.batching.endpoint_check import check_endpoint
from lanes_pipeline.gpu_lane.adapters import local_side_problem
from lanes_pipeline.settings import ConfigError, ConfigIssue, Settings, load_settings


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
    # Beyond the files' own values: what they name on this machine must exist, and the CPU lane's
    # endpoints must be llama-servers.
    lanes_file = settings.config_dir / "lanes.yaml"
    with suppress(ValueError):  # as the other messages say it: relative to the working folder if inside
        lanes_file = lanes_file.resolve().relative_to(Path.cwd().resolve())
    issues = []
    problem = local_side_problem(settings.lanes.gpu_lane.adapter_paths)
    if problem is not None:
        issues.append(ConfigIssue(str(lanes_file), "gpu_lane.adapter_paths.local", problem))
    issues += _endpoint_issues(settings, str(lanes_file))
    if issues:
        for issue in issues:
            click.echo(str(issue), err=True)
        click.echo(f"{len(issues)} problem(s) found", err=True)
        raise SystemExit(1)
    click.echo(f"{settings.config_dir}: all config files are valid")


def _endpoint_issues(settings: Settings, lanes_file: str) -> list[ConfigIssue]:
    """Each of cpu_lane.endpoints that answers but is not a llama-server (or refuses its key) is a
    problem; one that does not answer now is noted (it may be started later; a batch fails over)."""
    issues = []
    for index, endpoint in enumerate(settings.lanes.cpu_lane.endpoints or []):
        key_env = endpoint.api_key_env or settings.lanes.cpu_lane.api_key_env
        verdict = check_endpoint(endpoint.base_url, os.environ.get(key_env) if key_env else None)
        if verdict.verdict == "unreachable":
            click.echo(f"note: cpu_lane.endpoints[{index}] does not answer now: {verdict.detail}", err=True)
        elif verdict.verdict != "llama-server":
            issues.append(ConfigIssue(lanes_file, f"cpu_lane.endpoints[{index}].base_url", verdict.detail))
    return issues


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

"""`lanes run`: the main job. Start the lanes, ask each one thing, materialize the assets, summarize, stop."""

from __future__ import annotations

import os
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import click

from lanes_pipeline.lanes.embedded import LANE_LABEL, LaneEndpoints, running_lanes
from lanes_pipeline.lanes.errors import LaneError
from lanes_pipeline.lanes.openai_api import OpenAIClient
from lanes_pipeline.lanes.probe import ProbeResult, probe
from lanes_pipeline.settings import ConfigError, Settings, load_settings


def use_project_instance(settings: Settings) -> Path:
    """Point DAGSTER_HOME at the project's persistent instance (data/dagster_home with our dagster.yaml),
    so runs made here show up in `make dev`, unless the user already chose one."""
    home = Path(os.environ.get("DAGSTER_HOME", settings.data_dir / "dagster_home"))
    home.mkdir(parents=True, exist_ok=True)
    link, source = home / "dagster.yaml", settings.project_root / "dagster.yaml"
    if not link.exists() and source.exists():
        link.symlink_to(source)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def _probe_lanes(settings: Settings, endpoints: LaneEndpoints) -> list[ProbeResult]:
    results = []
    for lane, model, config in (
        ("cpu", settings.lanes.cpu_lane.model_alias, settings.lanes.cpu_lane),
        ("gpu", settings.lanes.gpu_lane.served_model_name, settings.lanes.gpu_lane),
    ):
        with OpenAIClient(
            LANE_LABEL[lane], endpoints.url(lane), config.api_key(), config.request_timeout_s
        ) as c:
            result = probe(c, model)
        prompt_speed = f", prompt {result.prompt_tokens_per_s} tok/s" if result.prompt_tokens_per_s else ""
        click.echo(
            f"\n[{result.lane} lane] {model} @ {endpoints.url(lane)}\n"
            f"  answer: {result.answer}\n"
            f"  generation {result.generation_tokens_per_s} tok/s{prompt_speed} "
            f"({result.completion_tokens} tokens in {result.latency_s} s; {result.speed_source})"
        )
        results.append(result)
    return results


# Step starts, results and our own log lines; not Dagster's DEBUG event stream.
_QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def _materialize_all(partition: date) -> list[tuple[str, str]]:
    """Materialize every asset of the code location: unpartitioned ones, then the partition `partition`."""
    from dagster import DagsterInstance, materialize

    from lanes_pipeline.definitions import defs

    instance = DagsterInstance.get()
    assets = list(defs.assets or [])
    resources = defs.resources or {}
    rows: list[tuple[str, str]] = []
    groups = (
        ([a for a in assets if getattr(a, "partitions_def", None) is None], None),
        ([a for a in assets if getattr(a, "partitions_def", None) is not None], partition.isoformat()),
    )
    for selected, partition_key in groups:
        if not selected:
            continue
        result = materialize(
            selected,
            resources=resources,
            instance=instance,
            partition_key=partition_key,
            raise_on_error=False,
        )
        for event in result.get_asset_materialization_events():
            rows.append((event.asset_key.to_user_string(), partition_key or "-"))
        if not result.success:
            failed = [e.step_key for e in result.all_events if e.is_step_failure]
            raise click.ClickException(
                f"materialization failed in step(s) {', '.join(failed)}; see `make dev`"
            )
    return rows


@click.command()
@click.option(
    "--date",
    "day",
    type=click.DateTime(["%Y-%m-%d"]),
    default=None,
    help="the daily partition to materialize (default: yesterday, UTC)",
)
def run(day: datetime | None) -> None:
    """The main job: start the lanes, probe each, materialize the assets, print a summary, stop the lanes."""
    started = time.perf_counter()
    partition = day.date() if day else datetime.now(UTC).date() - timedelta(days=1)
    try:
        settings = load_settings()
        home = use_project_instance(settings)
        click.echo(f"[lanes] starting the lanes (Dagster instance: {home})")
        with running_lanes(settings) as endpoints:
            probes = _probe_lanes(settings, endpoints)
            click.echo(f"\n[lanes] materializing assets for {partition.isoformat()}")
            rows = _materialize_all(partition)
            click.echo("[lanes] stopping the lanes")
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo("\nSummary")
    for result in probes:
        click.echo(
            f"  {result.lane} lane: {result.generation_tokens_per_s:>7} tok/s generation, "
            f"{result.latency_s:>6} s latency"
        )
    for asset_key, partition_key in rows:
        click.echo(f"  materialized {asset_key} (partition {partition_key})")
    click.echo(f"  wall time {time.perf_counter() - started:.0f} s")

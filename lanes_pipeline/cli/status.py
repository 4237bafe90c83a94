"""`lanes status [--json]`: the state at a glance. Each lane up or down (URL, models, slots busy, requests
waiting), the alias and the version it serves with its figures and since when, the last day's run, the next
scheduled one, and each repository's coverage. Reads; starts nothing. Exit code 3 when a lane is down.

The gathering (I/O) is here; the model, its text and the exit code are `status_view.py`'s."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, DefaultScheduleStatus, RunsFilter
from pydantic import TypeAdapter

from lanes_pipeline.cli.run import DAILY_JOB
from lanes_pipeline.cli.status_view import (
    LANE_DOWN_EXIT,
    AliasStatus,
    LaneStatus,
    LastDay,
    NextRun,
    Status,
    alias_of,
    lane_down,
    lane_up,
    last_day,
    next_daily_run,
    render,
)
from lanes_pipeline.cpu_lane.batching.client import ServerProps
from lanes_pipeline.cpu_lane.jobs.tests_day import COVERAGE_FILE, COVERAGE_FOLDER, SymbolTestCoverage
from lanes_pipeline.embedded.servers import LANE_LABEL, running_embedded_url
from lanes_pipeline.errors import LaneError
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.resources import REGISTRY_FILE, AdapterRegistryResource
from lanes_pipeline.http import NO_RETRY, ModelList, OpenAIClient
from lanes_pipeline.loop.schedules import DAILY_SCHEDULE
from lanes_pipeline.metrics.bandwidth import read_counters
from lanes_pipeline.settings import ConfigError, CpuLane, GpuLane, LaneName, Settings, load_settings
from lanes_pipeline.store import ArtifactStore

__all__ = ["LANE_DOWN_EXIT", "status"]

PROBE_TIMEOUT_S = 5.0
# The assets whose latest metadata for the last day `lanes status` reads.
DAY_ASSETS = ("accepted_work", "lora_dataset", "lora_adapter", "adapter_evaluation", "review_branch")


# -- lanes --------------------------------------------------------------------------------------------------


def lane_urls(settings: Settings) -> Iterator[tuple[LaneName, str | None, str | None]]:
    """(lane, URL, API-key env var) of each server the configs name: an embedded lane at the URL its running
    server published, else at its configured port; the CPU lane's endpoints each."""
    cpu, gpu = settings.lanes.cpu_lane, settings.lanes.gpu_lane
    if cpu.endpoints:
        for endpoint in cpu.endpoint_list():
            yield "cpu", endpoint.base_url, endpoint.api_key_env
    else:
        yield "cpu", _url(settings, "cpu", cpu), cpu.api_key_env
    yield "gpu", _url(settings, "gpu", gpu), gpu.api_key_env


def _url(settings: Settings, lane: LaneName, config: CpuLane | GpuLane) -> str | None:
    if not config.is_embedded:
        return config.base_url
    running = running_embedded_url(settings.data_dir, lane)
    if running is not None:
        return running
    return f"http://127.0.0.1:{config.embedded.port}" if config.embedded.port else None


def probe_lane(lane: LaneName, url: str | None, key_env: str | None) -> tuple[LaneStatus, ModelList | None]:
    """One lane's state from its /v1/models, /metrics and (llama-server) /props; the models it lists."""
    if url is None:
        return lane_down(
            lane, url, "the embedded server is not running (port 0: a free port when it starts)"
        ), None
    key = os.environ.get(key_env) if key_env else None
    if key_env and key is None:
        return lane_down(
            lane, url, f"environment variable {key_env} (the lane's api_key_env) is not set"
        ), None
    # One try each, a short wait to connect: a status is a glance, and its errors name the lane.
    with OpenAIClient(
        LANE_LABEL[lane], url, key, timeout_s=PROBE_TIMEOUT_S, connect_timeout_s=2.0, retry=NO_RETRY
    ) as client:
        try:
            models = client.models()
        except LaneError as exc:
            return lane_down(lane, url, str(exc)), None
        counters = read_counters(client)
        slots = None
        if lane == "cpu":
            try:
                props = client.request("GET", "/props", retries=False)
                slots = ServerProps.model_validate(props.json()).total_slots if props.is_success else None
            except (LaneError, ValueError):
                slots = None
    return lane_up(lane, url, models, counters, slots), models


def read_alias(alias: str, gpu_models: ModelList | None) -> AliasStatus:
    """The registry's record of the alias, without creating a registry where there is none yet."""
    path = AdapterRegistryResource().folder() / REGISTRY_FILE
    if not path.is_file():
        return alias_of(alias, [], None, gpu_models)
    registry = AdapterRegistry(path)
    history = registry.alias_history(alias)
    target = registry.get(history[-1].version) if history else None
    return alias_of(alias, history, target, gpu_models)


# -- the last day, from the Dagster instance ----------------------------------------------------------------


def dagster_home(settings: Settings) -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or settings.data_dir / "dagster_home")


def read_last_day(settings: Settings) -> LastDay | None:
    """The newest daily_lanes run on the project's instance, and its day's assets' metadata; None when
    there is no instance yet (nothing is created for asking)."""
    home = dagster_home(settings)
    if not (home / "dagster.yaml").is_file() and not (home / "storage").is_dir():
        return None
    os.environ["DAGSTER_HOME"] = str(home)
    with DagsterInstance.get() as instance:
        records = instance.get_run_records(RunsFilter(job_name=DAILY_JOB), limit=1)
        if not records:
            return None
        record = records[0]
        run = record.dagster_run
        day = run.tags.get("dagster/partition", "?")
        metadata: dict[str, dict[str, Any]] = {}
        for asset in DAY_ASSETS:
            found = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[day]), limit=1
            ).records
            if found and found[0].asset_materialization is not None:
                values = found[0].asset_materialization.metadata
                metadata[asset] = {key: getattr(value, "value", value) for key, value in values.items()}
    ended = datetime.fromtimestamp(record.end_time, UTC) if record.end_time else None
    return last_day(day, run.run_id, run.status.value.lower(), ended, metadata)


# -- the schedule and the coverage --------------------------------------------------------------------------


def read_next_run(now: datetime) -> NextRun:
    """The daily schedule as the code location defines it: its cron, time zone and default status."""
    from lanes_pipeline import definitions  # read at call time: tests swap in their own definitions

    schedule = definitions.defs().resolve_schedule_def(DAILY_SCHEDULE)
    timezone = schedule.execution_timezone or "UTC"
    cron = schedule.cron_schedule
    if not isinstance(cron, str):
        raise ValueError(f"{DAILY_SCHEDULE} has several cron strings ({cron}); expected one daily one")
    at, for_day = next_daily_run(cron, timezone, now)
    enabled = schedule.default_status == DefaultScheduleStatus.RUNNING
    return NextRun(
        schedule=DAILY_SCHEDULE, cron=cron, timezone=timezone, at=at, for_day=for_day, enabled=enabled
    )


def read_coverage(store: ArtifactStore) -> tuple[str | None, list[SymbolTestCoverage]]:
    """The newest day of generated_tests that recorded each repository's coverage."""
    folder = store.root / COVERAGE_FOLDER
    recorded = folder.iterdir() if folder.is_dir() else iter(())
    # dot-folders are the store's staging folders, never a partition
    days = sorted(p.name for p in recorded if not p.name.startswith(".") and (p / COVERAGE_FILE).is_file())
    if not days:
        return None, []
    where = folder / days[-1] / COVERAGE_FILE
    try:
        rows = TypeAdapter(list[SymbolTestCoverage]).validate_json(where.read_bytes())
    except ValueError as exc:
        raise ValueError(f"{where}: not a list of repository coverages: {exc}") from exc
    return days[-1], rows


def gather(settings: Settings, now: datetime) -> Status:
    problems: list[str] = []
    lanes: list[LaneStatus] = []
    gpu_models: ModelList | None = None
    for lane, url, key_env in lane_urls(settings):
        state, models = probe_lane(lane, url, key_env)
        lanes.append(state)
        if lane == "gpu":
            gpu_models = models
    alias_name = settings.lanes.gpu_lane.alias_name
    try:
        alias = read_alias(alias_name, gpu_models)
    except Exception as exc:  # an unreadable registry is reported; the rest is still shown
        problems.append(f"adapter registry: {type(exc).__name__}: {exc}")
        alias = alias_of(alias_name, [], None, gpu_models)
    day = next_run = None
    try:
        day = read_last_day(settings)
    except Exception as exc:
        problems.append(f"Dagster instance at {dagster_home(settings)}: {type(exc).__name__}: {exc}")
    try:
        next_run = read_next_run(now)
    except Exception as exc:
        problems.append(f"the daily schedule: {type(exc).__name__}: {exc}")
    coverage_day, coverage = None, []
    try:
        coverage_day, coverage = read_coverage(ArtifactStore(settings.data_dir / "artifacts"))
    except (OSError, ValueError) as exc:
        problems.append(f"coverage: {exc}")
    return Status(
        checked_at=now,
        lanes=lanes,
        alias=alias,
        last_day=day,
        next_run=next_run,
        coverage_day=coverage_day,
        coverage=coverage,
        problems=problems,
    )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="the same status as one JSON object")
def status(as_json: bool) -> None:
    """The state at a glance: each lane up or down (URL, models, slots busy, requests waiting), the alias
    and the version it serves (its figures, since when), the last day's run, the next scheduled run, and
    each repository's coverage. Starts nothing. Exit code 3 when a lane is down (the status is printed
    all the same)."""
    try:
        settings = load_settings()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    result = gather(settings, datetime.now(UTC))
    click.echo(result.model_dump_json(indent=1) if as_json else render(result))
    code = result.exit_code()
    if code:
        raise click.exceptions.Exit(code)

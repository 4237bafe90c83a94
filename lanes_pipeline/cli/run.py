"""`lanes run`: the whole daily pipeline once. Start the lanes, ask each one thing, run `daily_lanes` for a
day (yesterday by default) on the project's instance, print a summary, stop the lanes. Ctrl-C, SIGTERM or
SIGHUP stop the run (Dagster marks it canceled) and the lanes it started."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import click

from lanes_pipeline.cli.run_summary import AssetOutcome, LaneDeltas, ServedState, render, summarize_day
from lanes_pipeline.cli.stopping import stop_like_ctrl_c
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.deploy.instance import in_process_run_tags, prepare_instance, use_project_instance
from lanes_pipeline.embedded.servers import LANE_LABEL, LaneEndpoints, LaneName, running_lanes
from lanes_pipeline.errors import LaneError
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.loop.progress import PREFIX, run_loggers
from lanes_pipeline.settings import ConfigError, Settings, load_settings
from lanes_pipeline.steps import STOP_REQUESTED

DAILY_JOB = "daily_lanes"

__all__ = ["run", "use_project_instance"]  # use_project_instance: kept importable from here


PROBE_LANES: dict[str, LaneName] = {"cpu_lane_probe": "cpu", "gpu_lane_probe": "gpu"}


def _probe_report(row: AssetOutcome) -> str:
    """What a lane probe asset measured, as `lanes run` prints it before the day's work."""
    lane, m = LANE_LABEL[PROBE_LANES[row.asset]], row.metadata
    if row.status != "materialized":
        return f"\n[{lane} lane] probe {row.status}: see the run in `make dev`"
    answer = str(m["answer"]).removeprefix("```\n").removesuffix("\n```")  # a code block in the UI
    prompt_speed = f", prompt {m['prompt_tokens_per_s']} tok/s" if m.get("prompt_tokens_per_s") else ""
    return (
        f"\n[{lane} lane] {m['model']} @ {m['url']}\n"
        f"  answer: {answer}\n"
        f"  generation {m['generation_tokens_per_s']} tok/s{prompt_speed} "
        f"({m['completion_tokens']} tokens in {m['latency_s']} s; {m['speed_source']})"
    )


def _probe_speed(row: AssetOutcome) -> str:
    """The probe's line in the closing summary."""
    m = row.metadata
    return (
        f"  {LANE_LABEL[PROBE_LANES[row.asset]]} lane: {m['generation_tokens_per_s']:>7} tok/s generation, "
        f"{m['latency_s']:>6} s latency"
    )


@dataclass(frozen=True)
class ServerCounts:
    """Server-side counters read before and after the day's assets."""

    cpu_prompt_tokens: float | None
    cpu_generated_tokens: float | None
    gpu_requests: float | None


def _read_counters(settings: Settings, endpoints: LaneEndpoints) -> ServerCounts:
    cpu_prompt = cpu_generated = gpu_requests = None
    cpu, gpu = settings.lanes.cpu_lane, settings.lanes.gpu_lane
    try:
        with CpuClient(endpoints.url("cpu"), cpu.api_key(), timeout_s=30.0) as client:
            counters = client.counters()
        cpu_prompt, cpu_generated = counters.prompt_tokens_total, counters.generation_tokens_total
    except (LaneError, ValueError):
        pass  # a server without --metrics: the summary says "-"
    try:
        with VllmClient(endpoints.url("gpu"), gpu.api_key(), timeout_s=30.0) as client:
            gpu_requests = client.metrics().get("vllm:request_success_total")
    except (LaneError, ValueError):
        pass
    return ServerCounts(cpu_prompt, cpu_generated, gpu_requests)


def _delta(after: float | None, before: float | None) -> float | None:
    return after - before if after is not None and before is not None else None


def _served(settings: Settings, endpoints: LaneEndpoints) -> ServedState | None:
    """What vLLM serves now: the alias, the version folder it was loaded from, every adapter loaded."""
    alias = settings.lanes.gpu_lane.alias_name
    try:
        with VllmClient(endpoints.url("gpu"), settings.lanes.gpu_lane.api_key(), timeout_s=30.0) as client:
            cards = client.adapters()
    except LaneError:
        return None
    target = next((Path(c.root).name for c in cards if c.id == alias and c.root), None)
    return ServedState(alias=alias, target=target, loaded=sorted(c.id for c in cards if c.id != alias))


def _plain(metadata: dict[str, Any]) -> dict[str, Any]:
    """Dagster metadata values -> plain Python values (numbers, strings, bools)."""
    return {key: getattr(value, "value", value) for key, value in metadata.items()}


def _outcomes(result: Any, selected: list[str], partition: str | None) -> list[AssetOutcome]:
    materialized = {
        event.asset_key.to_user_string(): _plain(dict(event.materialization.metadata))
        for event in result.get_asset_materialization_events()
    }
    failed = {event.step_key for event in result.all_events if event.is_step_failure}
    outcomes = []
    for asset in selected:
        if asset in materialized:
            outcomes.append(
                AssetOutcome(
                    asset=asset, partition=partition, status="materialized", metadata=materialized[asset]
                )
            )
        else:
            # Not materialized and not failed: skipped, e.g. lora_adapter on a window without rows.
            status = "failed" if asset in failed else "skipped"
            outcomes.append(AssetOutcome(asset=asset, partition=partition, status=status))
    return outcomes


def stop_if_interrupted(result: Any) -> None:
    """Ctrl-C, SIGTERM or SIGHUP during `execute_in_process` stop the run at its next checkpoint, and Dagster
    records it as failed for an unexpected termination and returns (raise_on_error=False) instead of raising:
    the command must stop there too, not go on with the day."""
    if STOP_REQUESTED.is_set():  # a stop signal: the run ended early, whatever Dagster calls it
        raise KeyboardInterrupt
    for event in result.all_events:  # a run that did not fail has no failure event
        reason = getattr(event.job_failure_data, "failure_reason", None) if event.is_run_failure else None
        if reason is not None and reason.value == "UNEXPECTED_TERMINATION":
            raise KeyboardInterrupt


def _run_day(
    settings: Settings, endpoints: LaneEndpoints, day: date, verbose: bool = False
) -> tuple[str, bool, list[str]]:
    """Run `daily_lanes` in this process: the unpartitioned lane probes, then the day's partition of every
    other asset, with the lanes' counters read around the latter; each step shows on the terminal as it
    starts and ends, with what it logs (loop/progress.py; `verbose`: Dagster's every event too). Returns
    the summary, success, failures."""
    from dagster import DagsterInstance

    from lanes_pipeline import definitions  # read at call time: tests swap in their own definitions

    instance = DagsterInstance.get()
    defs = definitions.defs()
    job = defs.resolve_job_def(DAILY_JOB)
    graph = defs.get_repository_def().asset_graph
    selected = job.asset_layer.executable_asset_keys
    keys = [key for key in graph.toposorted_asset_keys if key in selected]  # pipeline order
    unpartitioned = [k for k in keys if graph.get(k).partitions_def is None]
    partitioned = [k for k in keys if graph.get(k).partitions_def is not None]
    tags = in_process_run_tags()
    # Step keys in the day's order: the terminal numbers the steps by it.
    run_config = {"loggers": run_loggers([key.to_python_identifier() for key in keys], verbose)}
    click.echo(f"{PREFIX} {len(keys)} steps: {', '.join(key.to_user_string() for key in keys)}")
    rows: list[AssetOutcome] = []
    failures: list[str] = []
    if unpartitioned:
        probes = job.execute_in_process(
            run_config=run_config,
            instance=instance,
            asset_selection=unpartitioned,
            tags=tags,
            raise_on_error=False,
        )
        stop_if_interrupted(probes)
        rows += _outcomes(probes, [k.to_user_string() for k in unpartitioned], None)
        failures += [] if probes.success else ["lane probes"]
    # The probe assets are the run's one request to each lane: printed now, summarized at the end.
    probe_rows = [r for r in rows if r.asset in PROBE_LANES]
    for row in probe_rows:
        click.echo(_probe_report(row))
    speeds = [_probe_speed(r) for r in probe_rows if r.status == "materialized"]
    partition = day.isoformat()
    before = _read_counters(settings, endpoints)
    result = job.execute_in_process(
        run_config=run_config,
        instance=instance,
        partition_key=partition,
        asset_selection=partitioned,
        tags=tags,
        raise_on_error=False,
    )
    stop_if_interrupted(result)
    after = _read_counters(settings, endpoints)
    rows += _outcomes(result, [k.to_user_string() for k in partitioned], partition)
    failures += [r.asset for r in rows if r.status == "failed"]
    deltas = LaneDeltas(
        cpu_prompt_tokens=_delta(after.cpu_prompt_tokens, before.cpu_prompt_tokens),
        cpu_generated_tokens=_delta(after.cpu_generated_tokens, before.cpu_generated_tokens),
        gpu_requests=_delta(after.gpu_requests, before.gpu_requests),
    )
    summary = summarize_day(partition, rows, deltas, _served(settings, endpoints))
    header = f"daily_lanes for {partition} (run {result.run_id[:8]})"
    return "\n".join([*speeds, header, render(summary)]), result.success and not failures, failures


def yesterday(settings: Settings) -> date:
    """The latest completed day in the partitions' time zone: what the schedule would run now."""
    return datetime.now(ZoneInfo(settings.pipeline.timezone)).date() - timedelta(days=1)


@click.command()
@click.option(
    "--date",
    "day",
    type=click.DateTime(["%Y-%m-%d"]),
    default=None,
    help="the daily partition to run (default: yesterday, in the partitions' time zone)",
)
@click.option(
    "--verbose", is_flag=True, help="Dagster's log of every event too, as `make dev`'s run view shows them"
)
def run(day: datetime | None, verbose: bool) -> None:
    """The whole daily pipeline: start the lanes, probe each, run daily_lanes for a day, summarize, stop.
    Each step shows as it starts and ends, a CPU-lane step also its items done of all with an ETA."""
    started = time.perf_counter()
    stop_like_ctrl_c()
    try:
        settings = load_settings()
        partition = day.date() if day else yesterday(settings)
        home = use_project_instance(settings)
        _instance, limits, released = prepare_instance(settings)
        pools = ", ".join(f"{pool} {limit}" for pool, limit in sorted(limits.items()))
        click.echo(f"[lanes] starting the lanes (Dagster instance: {home}; pool limits: {pools})")
        for run_id in released:
            click.echo(f"[lanes] run {run_id} had died holding pool slots: marked failed, slots freed")
        with running_lanes(settings) as endpoints:
            click.echo(f"\n[lanes] running daily_lanes for {partition.isoformat()}")
            summary, success, failures = _run_day(settings, endpoints, partition, verbose)
            click.echo("[lanes] stopping the lanes")
    except KeyboardInterrupt:
        click.echo("[lanes] interrupted; the run is stopped and the lanes it started are down", err=True)
        raise click.exceptions.Exit(130) from None
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo("\nSummary")
    click.echo(summary)
    click.echo(f"  wall time {time.perf_counter() - started:.0f} s")
    if not success:
        failed = ", ".join(failures) or "the run"
        raise click.ClickException(f"daily_lanes failed in {failed}; see the run in `make dev`")

"""`lanes backfill --from A --to B`: the days the machine was off, as the UI's "Materialize" of a partition
range would submit them: one asset backfill on the project's instance, which the daemon (`make dev`) runs.

Day order: the backfill daemon requests one run per day, oldest first, into a first-in-first-out queue, and
dagster.yaml lets one backfill run through at a time: day D is trained, judged and promoted before day D+1's
run starts.
"""

from __future__ import annotations

import time
from datetime import date, datetime, timedelta

import click

from lanes_pipeline.daily.instance import prepare_instance, use_project_instance
from lanes_pipeline.settings import ConfigError, load_settings

DAILY_JOB = "daily_lanes"
TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
# The daemons that turn a backfill into runs and run them; without them a backfill waits.
NEEDED_DAEMONS = ("BACKFILL", "QUEUED_RUN_COORDINATOR")
HEARTBEAT_FRESH_S = 120


def day_range(first: date, last: date) -> list[str]:
    if last < first:
        raise click.BadParameter(f"--to {last} is before --from {first}")
    return [(first + timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]


def submit_backfill(days: list[str], title: str) -> str:
    """Add an asset backfill of every daily asset of daily_lanes for `days`; return its id."""
    from dagster import DagsterInstance
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id

    from lanes_pipeline import definitions  # read at call time: tests swap in their own definitions

    instance = DagsterInstance.get()
    defs = definitions.defs()
    graph = defs.get_repository_def().asset_graph
    job = defs.resolve_job_def(DAILY_JOB)
    daily = [
        key
        for key in graph.toposorted_asset_keys
        if key in job.asset_layer.executable_asset_keys and graph.get(key).partitions_def is not None
    ]
    unknown = set(days) - set(graph.get(daily[0]).partitions_def.get_partition_keys())  # type: ignore[union-attr]
    if unknown:
        raise click.BadParameter(f"not daily partitions (yet): {', '.join(sorted(unknown))}")
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=make_new_backfill_id(),
        asset_graph=graph,
        partition_names=days,
        asset_selection=daily,
        backfill_timestamp=time.time(),
        tags={},
        dynamic_partitions_store=instance,
        all_partitions=False,
        title=title,
        description=f"lanes backfill of {len(days)} day(s) of {DAILY_JOB}",
        run_config=None,
    )
    instance.add_backfill(backfill)
    return backfill.backfill_id


def daemons_alive() -> bool:
    from dagster import DagsterInstance

    beats = DagsterInstance.get().get_daemon_heartbeats()
    now = time.time()
    return all(name in beats and now - beats[name].timestamp < HEARTBEAT_FRESH_S for name in NEEDED_DAEMONS)


def wait_for(backfill_id: str, poll_s: float = 5.0) -> str:
    """Block until the backfill ends; print each change of its runs; return its final status."""
    from dagster import DagsterInstance, RunsFilter
    from dagster._core.storage.tags import BACKFILL_ID_TAG

    instance = DagsterInstance.get()
    seen: dict[str, str] = {}
    while True:
        backfill = instance.get_backfill(backfill_id)
        assert backfill is not None
        for run in instance.get_runs(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id})):
            state = f"{run.tags.get('dagster/partition', '?')} {run.status.value}"
            if seen.get(run.run_id) != state:
                seen[run.run_id] = state
                click.echo(f"  run {run.run_id[:8]}: {state}")
        if backfill.status.value in TERMINAL:
            return backfill.status.value
        time.sleep(poll_s)


@click.command()
@click.option("--from", "first", type=click.DateTime(["%Y-%m-%d"]), required=True, help="first day")
@click.option("--to", "last", type=click.DateTime(["%Y-%m-%d"]), required=True, help="last day (included)")
@click.option("--wait", is_flag=True, help="block until the backfill has finished, printing its runs")
def backfill(first: datetime, last: datetime, wait: bool) -> None:
    """Backfill daily_lanes for the days FROM..TO (e.g. the days the machine was off); `make dev` runs it."""
    try:
        settings = load_settings()
        use_project_instance(settings)
        prepare_instance(settings)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    days = day_range(first.date(), last.date())
    backfill_id = submit_backfill(days, title=f"daily_lanes {days[0]}..{days[-1]}")
    click.echo(f"backfill {backfill_id}: daily_lanes for {days[0]} .. {days[-1]} ({len(days)} days)")
    if not daemons_alive():
        click.echo("  no Dagster daemon has reported on this instance lately: it runs once `make dev` is up")
    if wait:
        status = wait_for(backfill_id)
        click.echo(f"backfill {backfill_id}: {status}")
        if status != "COMPLETED_SUCCESS":
            raise click.ClickException(f"backfill {backfill_id} ended {status}; see Overview > Backfills")

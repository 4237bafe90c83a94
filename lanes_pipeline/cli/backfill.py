"""`lanes backfill --from A --to B`: the days the machine was off, as the UI's backfill of a partition range
of the `daily_lanes` job would submit them: one job backfill on the project's instance, which the daemon
(`make dev`) runs.

One run per day, in day order: a job backfill's runs each hold the whole job for their day (an asset
backfill would plan runs by the assets' partition mappings, and lora_adapter's replay window splits the GPU
chain off the day's CPU-lane run); the daemon submits them oldest first into a first-in-first-out queue, and
dagster.yaml lets one backfill run through at a time: day D is trained, judged and promoted before day D+1's
run starts.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from lanes_pipeline.cli.stopping import child_group, raise_if_stopped, sleep_unless_stopped, stop_like_ctrl_c
from lanes_pipeline.deploy.instance import prepare_instance, use_project_instance
from lanes_pipeline.settings import ConfigError, load_settings

DAILY_JOB = "daily_lanes"
TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
# The daemons that turn a backfill into runs and run them; without them a backfill waits.
NEEDED_DAEMONS = ("BACKFILL", "QUEUED_RUN_COORDINATOR")
HEARTBEAT_FRESH_S = 120
BACKFILL_ID_TAG = "dagster/backfill"  # the tag Dagster puts on each run of a backfill


def day_range(first: date, last: date) -> list[str]:
    if last < first:
        raise click.BadParameter(f"--to {last} is before --from {first}")
    return [(first + timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]


# How the backfill is submitted, with public Dagster APIs only. Dagster's Python constructors of backfills
# are private; `dagster job backfill` submits every day's run at once (no backfill for the daemon to order);
# `DagsterGraphQLClient` needs a running webserver, and `make dev` may not run one (the daemon alone runs
# backfills). The `dagster-graphql` CLI runs the UI's own mutation, `launchPartitionBackfill`, against the
# workspace in a process of its own, on the instance of DAGSTER_HOME: with a partition set selector it is the
# job backfill the UI's Partitions page of daily_lanes launches, with an asset selection the asset backfill
# its Lineage page launches.
LAUNCH_BACKFILL = """
mutation LanesBackfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PartitionKeysNotFoundError { partitionKeys }
    ... on Error { message }
  }
}
"""
# Loading the workspace starts a code server in the child's process group; a stopped submission is killed
# with it at once: given a grace period, dagster-graphql can finish the mutation first, and the
# backfill the user stopped would go to the daemon anyway.
SUBMIT_GRACE_S = 0.0
# Where Dagster finds daily_lanes: workspace.yaml's location, the default repository of a Definitions, and
# the partition set Dagster names after a partitioned job.
LOCATION_NAME = "lanes_pipeline"
REPOSITORY_NAME = "__repository__"
PARTITION_SET_SUFFIX = "_partition_set"


def check_days(days: list[str]) -> list[str]:
    """`days` must be partitions of daily_lanes already (none after the latest completed day). Returns the
    job's daily assets (an asset backfill's selection)."""
    from lanes_pipeline import definitions  # read at call time: tests swap in their own definitions

    defs = definitions.defs()
    job = defs.resolve_job_def(DAILY_JOB)
    assert job.partitions_def is not None, f"{DAILY_JOB} has no partitions"
    unknown = set(days) - set(job.partitions_def.get_partition_keys())
    if unknown:
        raise click.BadParameter(f"not daily partitions (yet): {', '.join(sorted(unknown))}")
    graph = defs.resolve_asset_graph()
    keys = job.asset_layer.executable_asset_keys
    return sorted(key.to_user_string() for key in keys if graph.get(key).partitions_def is not None)


def backfill_params(days: list[str], title: str, assets: list[str] | None = None) -> dict[str, Any]:
    """launchPartitionBackfill's parameters over `days`: a backfill of the daily_lanes job, or with `assets`
    an asset backfill of them (Dagster plans its runs by the assets' dependencies)."""
    described = f"lanes backfill of {len(days)} day(s) of " + ("the daily assets" if assets else DAILY_JOB)
    common = {"title": title, "description": described}
    if assets:
        # The days of every asset, named: given only partition names, Dagster targets them for the root
        # assets and every partition mapped from them downstream, which through lora_adapter's replay window
        # are the days after the range as well.
        days_range = {"range": {"start": days[0], "end": days[-1]}}
        by_asset = [{"assetKey": {"path": key.split("/")}, "partitions": days_range} for key in assets]
        return {"partitionsByAssets": by_asset, **common}
    return {
        "selector": {
            "partitionSetName": DAILY_JOB + PARTITION_SET_SUFFIX,
            "repositorySelector": {
                "repositoryLocationName": LOCATION_NAME,
                "repositoryName": REPOSITORY_NAME,
            },
        },
        "partitionNames": days,
        **common,
    }


def _dagster_graphql() -> str:
    beside = Path(sys.executable).parent / "dagster-graphql"  # the venv's console script
    found = str(beside) if beside.exists() else shutil.which("dagster-graphql")
    if found is None:
        raise click.ClickException("dagster-graphql not found beside the interpreter nor on PATH")
    return found


def submit_backfill(project_root: Path, days: list[str], title: str, of_assets: bool = False) -> str:
    """Submit a backfill of the daily_lanes job (or, `of_assets`, of its daily assets) for `days`; return
    its id."""
    assets = check_days(days)
    with tempfile.TemporaryDirectory(prefix="lanes-backfill-") as tmp:
        answer_path, log_path = Path(tmp) / "answer.json", Path(tmp) / "graphql.log"
        argv = [_dagster_graphql(), "-w", "workspace.yaml", "-t", LAUNCH_BACKFILL]
        params = backfill_params(days, title, assets if of_assets else None)
        argv += ["-v", json.dumps({"params": params}), "-o", str(answer_path)]
        with (
            log_path.open("wb") as log,
            child_group(argv, cwd=project_root, grace_s=SUBMIT_GRACE_S, stdout=log) as child,
        ):
            code = child.wait()
        answer = answer_path.read_text() if answer_path.exists() else ""
        if code != 0 or not answer:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise click.ClickException(
                f"dagster-graphql failed (exit {code}) submitting the backfill:\n{tail}"
            )
    return backfill_id_from(json.loads(answer))


def backfill_id_from(answer: dict[str, Any]) -> str:
    """The backfill id from launchPartitionBackfill's answer, or an error that says what Dagster refused."""
    if answer.get("errors"):
        raise click.ClickException(f"Dagster refused the backfill: {answer['errors'][0].get('message')}")
    result = answer["data"]["launchPartitionBackfill"]
    if result["__typename"] == "LaunchBackfillSuccess":
        return str(result["backfillId"])
    detail = result.get("message") or result.get("partitionKeys") or result["__typename"]
    raise click.ClickException(f"Dagster refused the backfill ({result['__typename']}): {detail}")


def daemons_alive() -> bool:
    from dagster import DagsterInstance

    beats = DagsterInstance.get().get_daemon_heartbeats()
    now = time.time()
    return all(name in beats and now - beats[name].timestamp < HEARTBEAT_FRESH_S for name in NEEDED_DAEMONS)


def wait_for(backfill_id: str, poll_s: float = 5.0) -> tuple[str, list[str]]:
    """Block until the backfill has ended and every run of it has finished (a job backfill can say it
    completed once its runs are submitted); print each change of its runs. Return its final status and the
    runs that did not succeed ("<day> <status>")."""
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    instance = DagsterInstance.get()
    seen: dict[str, str] = {}
    while True:
        backfill = instance.get_backfill(backfill_id)
        if backfill is None:
            raise click.ClickException(
                f"backfill {backfill_id} is not on this instance ({instance.root_directory})"
            )
        runs = instance.get_runs(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
        for run in runs:
            state = f"{run.tags.get('dagster/partition', '?')} {run.status.value}"
            if seen.get(run.run_id) != state:
                seen[run.run_id] = state
                click.echo(f"  run {run.run_id[:8]}: {state}")
        if backfill.status.value in TERMINAL and all(run.is_finished for run in runs):
            failed = [seen[run.run_id] for run in runs if run.status != DagsterRunStatus.SUCCESS]
            return backfill.status.value, failed
        sleep_unless_stopped(poll_s)  # also ends on a stop whose interrupt a query's cleanup swallowed


@click.command()
@click.option("--from", "first", type=click.DateTime(["%Y-%m-%d"]), required=True, help="first day")
@click.option("--to", "last", type=click.DateTime(["%Y-%m-%d"]), required=True, help="last day (included)")
@click.option("--wait", is_flag=True, help="block until the backfill has finished, printing its runs")
@click.option(
    "--assets",
    "of_assets",
    is_flag=True,
    help="an asset backfill (the UI's Lineage route): runs planned by the assets' dependencies",
)
def backfill(first: datetime, last: datetime, wait: bool, of_assets: bool) -> None:
    """Backfill the days FROM..TO (e.g. the days the machine was off): the daily_lanes job, one run per day
    in day order, or with --assets its daily assets, each day judged after the day before was served;
    `make dev` runs it."""
    stop_like_ctrl_c()  # SIGTERM / SIGHUP: the submission's processes stop, as on Ctrl-C
    try:
        settings = load_settings()
        use_project_instance(settings)
        prepare_instance(settings)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    days = day_range(first.date(), last.date())
    what = "daily assets" if of_assets else DAILY_JOB
    title = f"{what} {days[0]}..{days[-1]}"
    backfill_id = submit_backfill(settings.project_root, days, title=title, of_assets=of_assets)
    click.echo(f"backfill {backfill_id}: {what} for {days[0]} .. {days[-1]} ({len(days)} days)")
    # From here on the backfill belongs to the instance, and the daemon goes on with it: a stop (also one
    # that lands while the daemons' heartbeats are read) ends only this command, as a stop, not an abort.
    try:
        if not daemons_alive():
            click.echo(
                "  no Dagster daemon has reported on this instance lately: it runs once `make dev` is up"
            )
        raise_if_stopped()
        if not wait:
            return
        status, failed = wait_for(backfill_id)
    except KeyboardInterrupt:
        stopped = "stopped waiting" if wait else "stopped"
        click.echo(f"{stopped}; backfill {backfill_id} goes on (Overview > Backfills)", err=True)
        raise click.exceptions.Exit(130) from None
    click.echo(f"backfill {backfill_id}: {status}")
    if status != "COMPLETED_SUCCESS" or failed:
        runs = f"; runs that did not succeed: {', '.join(failed)}" if failed else ""
        raise click.ClickException(f"backfill {backfill_id} ended {status}{runs}; see Overview > Backfills")

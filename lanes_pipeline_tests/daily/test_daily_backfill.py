"""A backfill of three missed days through the daemon path, as a user runs it: `dagster-daemon run` on the
project's instance, then `lanes backfill --from --to --wait` (the README's command; the same backfill of the
daily_lanes job the UI's Partitions page submits). The backfill completes, every day's assets are
materialized in that day's one run (lora_adapter's replay window mapping notwithstanding), and training,
evaluation and promotion happen in day order: day D's adapter is trained, judged and served before day
D+1's is trained.

The instance here is the Postgres variant (dagster.postgres.yaml) on a real local PostgreSQL started for
this module (lanes_pipeline/deploy/postgres.py): the daemon, the backfill's submission and the run workers all
share it; the other daily tests keep the SQLite instance of dagster.yaml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, EventLogRecord, EventRecordsFilter
from dagster_postgres import PostgresRunStorage

from lanes_pipeline.deploy import postgres
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.settings import Settings, project_root
from lanes_pipeline_tests.daily.fixtures import TRAINING, DailyProject, daily_project

pytestmark = [pytest.mark.cpu_lane, pytest.mark.gpu_lane]
DAYS = ("2026-11-01", "2026-11-02", "2026-11-03")  # the sample repository's three commits
GPU_CHAIN = ("lora_adapter", "adapter_evaluation", "served_adapter")
EVERY_DAY = (
    "repo_snapshot",
    "repo_analysis",
    "generated_tests",
    "refactor_proposals",
    "lora_dataset",
    *GPU_CHAIN,
)


@pytest.fixture
def daemon(project: DailyProject) -> Iterator[subprocess.Popen[bytes]]:
    """`dagster-daemon run` on the project's instance: backfills, the run queue, run monitoring."""
    log = (project.dagster_home / "daemon.log").open("wb")
    daemon_cli = Path(sys.executable).parent / "dagster-daemon"  # Dagster's public entry point
    process = subprocess.Popen(
        [str(daemon_cli), "run", "-w", "workspace.yaml"],
        cwd=project_root(),
        env={**os.environ, **project.env()},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with DagsterInstance.from_config(str(project.dagster_home)) as instance:
            deadline = time.monotonic() + 300
            while "BACKFILL" not in instance.get_daemon_heartbeats() and time.monotonic() < deadline:
                assert process.poll() is None, (project.dagster_home / "daemon.log").read_text()[-3000:]
                time.sleep(1)
        yield process
    finally:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
        log.close()


@pytest.fixture(scope="module")
def pg_server() -> Iterator[postgres.PostgresServer]:
    """A real PostgreSQL in a scratch folder on a free port, stopped (no process left) after the module."""
    with postgres.temporary_server() as server:
        yield server


@pytest.fixture
def project(
    cpu_server: EmbeddedServer,
    gpu_server: EmbeddedServer,
    settings: Settings,
    tmp_path: Path,
    pg_server: postgres.PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
) -> DailyProject:
    # Two training steps a day and one task of each kind to judge them: the order of the days is under test
    # here, not what the adapter learns (the evaluation took 81 s of a 4-minute day with the shared three
    # repository tasks and two HumanEval problems). The schedules off: the daemon would start their runs when
    # the test spans a tick (CI's run crossed 03:00 UTC, the lane benchmark's, and found a fourth run
    # besides the backfill's three).
    evaluation = TRAINING["evaluation"] | {"humaneval_problems": 1, "max_repo_tasks": 1}
    project = daily_project(
        tmp_path,
        settings,
        cpu_server.url,
        gpu_server.url,
        training={"max_steps": 2, "evaluation": evaluation},
        pipeline_changes={"schedule_enabled": False},
    )
    # The instance on Postgres: the variant's yaml, its LANES_PG_* variables in this process and so in every
    # process the test starts (the daemon, `lanes backfill`, the run workers they launch).
    shutil.copy(project_root() / postgres.POSTGRES_YAML, project.dagster_home / "dagster.yaml")
    for name, value in pg_server.env().items():
        if name != "DAGSTER_HOME":  # the project's own instance folder keeps the compute logs and artifacts
            monkeypatch.setenv(name, value)
    # The schema made now, in one process (a daemon and a CLI creating it at once race on migrations).
    DagsterInstance.from_config(str(project.dagster_home)).dispose()
    return project


def _records(instance: DagsterInstance, asset: str) -> list[EventLogRecord]:
    records = instance.get_event_records(
        EventRecordsFilter(event_type=DagsterEventType.ASSET_MATERIALIZATION, asset_key=AssetKey(asset))
    )
    return sorted((r for r in records if r.partition_key), key=lambda r: r.timestamp)


def _materializations(instance: DagsterInstance, asset: str) -> dict[str, float]:
    """partition -> timestamp of its (last) materialization."""
    return {r.partition_key: r.timestamp for r in _records(instance, asset) if r.partition_key}


def _materializing_runs(instance: DagsterInstance, asset: str) -> dict[str, str]:
    """partition -> id of the run of its (last) materialization."""
    return {r.partition_key: r.run_id for r in _records(instance, asset) if r.partition_key}


def _connection(server: postgres.PostgresServer) -> dict[str, object]:
    return {
        "host": server.host,
        "port": server.port,
        "user": server.user,
        "password": server.password,
        "dbname": server.db_name,
    }


@pytest.mark.timeout(2400)  # three days of work through the daemon on 2 shared cores
def test_backfill_of_three_missed_days_runs_them_in_day_order(
    project: DailyProject,
    daemon: subprocess.Popen[bytes],
    monkeypatch: pytest.MonkeyPatch,
    pg_server: postgres.PostgresServer,
) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "lanes_pipeline.cli",
            "backfill",
            "--from",
            DAYS[0],
            "--to",
            DAYS[-1],
            "--wait",
        ],
        cwd=project_root(),
        env={**os.environ, **project.env()},
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    daemon_log = (project.dagster_home / "daemon.log").read_text(errors="replace")
    assert result.returncode == 0, result.stdout + result.stderr + daemon_log[-4000:]
    assert daemon.poll() is None, daemon_log[-4000:]
    assert "COMPLETED_SUCCESS" in result.stdout and "no Dagster daemon" not in result.stdout

    monkeypatch.setenv("DAGSTER_HOME", str(project.dagster_home))
    with DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        done = {asset: _materializations(instance, asset) for asset in EVERY_DAY}
        made_by = {asset: _materializing_runs(instance, asset) for asset in EVERY_DAY}
        [backfill] = instance.get_backfills()
        records = sorted(instance.get_run_records(), key=lambda record: record.create_timestamp)
    runs = [record.dagster_run for record in records]
    for asset, days in done.items():
        assert set(days) == set(DAYS), f"{asset}: materialized for {sorted(days)}"
    # Day order: D's adapter trained, judged and served before D+1's is trained; within a day, in that order.
    order = [done[asset][day] for day in DAYS for asset in GPU_CHAIN]
    assert order == sorted(order), {day: [done[a][day] for a in GPU_CHAIN] for day in DAYS}
    assert [run.tags["dagster/partition"] for run in runs] == list(DAYS)  # one run per day, oldest first
    assert backfill.status.value == "COMPLETED_SUCCESS"
    assert all(run.tags.get("dagster/backfill") == backfill.backfill_id for run in runs)
    # Each day's whole job in that day's run: the GPU chain is not split off by lora_adapter's window mapping.
    assert all(run.job_name == "daily_lanes" for run in runs)
    run_of_day = {run.tags["dagster/partition"]: run.run_id for run in runs}
    for asset, runs_by_day in made_by.items():
        assert runs_by_day == run_of_day, (
            f"{asset}: materialized in runs {runs_by_day}, days' runs {run_of_day}"
        )
    # The runs are rows of the Postgres database (no SQLite file took them).
    connection = psycopg2.connect(**_connection(pg_server))
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT run_id FROM runs")
            assert sorted(row[0] for row in cursor.fetchall()) == sorted(run.run_id for run in runs)
    finally:
        connection.close()
    took = time.monotonic() - started
    print(f"backfill of {len(DAYS)} days in {took:.0f} s, {len(runs)} runs:\n{result.stdout}")

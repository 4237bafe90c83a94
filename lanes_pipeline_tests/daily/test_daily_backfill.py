"""A backfill of three missed days through the daemon path, as a user runs it: `dagster-daemon run` on the
project's instance, then `lanes backfill --from --to --wait` (the README's command; the same backfill of the
daily_lanes job the UI's Partitions page submits). The backfill completes, every day's assets are
materialized in that day's one run (lora_adapter's replay window mapping notwithstanding), and training,
evaluation and promotion happen in day order: day D's adapter is trained, judged and served before day
D+1's is trained."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, EventLogRecord, EventRecordsFilter

from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.settings import Settings, project_root
from lanes_pipeline_tests.daily.fixtures import DailyProject, daily_project

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


@pytest.fixture
def project(
    cpu_server: EmbeddedServer, gpu_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> DailyProject:
    # Two training steps a day: the order of the days is under test here, not what the adapter learns.
    return daily_project(tmp_path, settings, cpu_server.url, gpu_server.url, training={"max_steps": 2})


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


@pytest.mark.timeout(2400)  # three days of work through the daemon on 2 shared cores
def test_backfill_of_three_missed_days_runs_them_in_day_order(
    project: DailyProject, daemon: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
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
    took = time.monotonic() - started
    print(f"backfill of {len(DAYS)} days in {took:.0f} s, {len(runs)} runs:\n{result.stdout}")

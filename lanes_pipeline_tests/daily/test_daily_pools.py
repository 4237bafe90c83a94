"""The project instance: pool limits from the configs, and a crashed run that cannot deadlock a pool.

A real run in a real process claims the gpu_lane pool's only slot and is killed with SIGKILL (what a power
cut or the OOM killer does); the next `lanes run` / `lanes dev` finds it, marks it failed and frees the slot,
and a new gpu_lane step runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from dagster import DagsterInstance, DagsterRunStatus

from lanes_pipeline.deploy.instance import (
    GPU_POOL,
    apply_pool_limits,
    orphaned_runs,
    pool_limits,
    release_orphaned_runs,
)
from lanes_pipeline.settings import Settings, project_root

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from dagster import DagsterInstance, Definitions, asset, define_asset_job
    from lanes_pipeline.deploy.instance import in_process_run_tags

    @asset(pool="gpu_lane")
    def holds_the_gpu() -> None:
        Path(sys.argv[1]).write_text("claimed")
        time.sleep(600)

    defs = Definitions(assets=[holds_the_gpu], jobs=[define_asset_job("holder", "*")])
    job = defs.resolve_job_def("holder")
    job.execute_in_process(instance=DagsterInstance.get(), tags=in_process_run_tags())
    """
)


@pytest.fixture
def project_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DagsterInstance]:
    """A persistent instance with the project's dagster.yaml, as `make run` / `make dev` use it."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(project_root() / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.get() as instance:
        yield instance


def test_pool_limits_come_from_the_configs(settings: Settings, project_instance: DagsterInstance) -> None:
    assert pool_limits(settings) == {"cpu_lane": 2, "gpu_lane": 1}  # configs/lanes.yaml: 2 slots
    four = settings.lanes.cpu_lane.model_copy(update={"max_slots": 4, "base_url": "http://127.0.0.1:1"})
    external = dataclasses.replace(settings, lanes=settings.lanes.model_copy(update={"cpu_lane": four}))
    assert pool_limits(external) == {"cpu_lane": 4, "gpu_lane": 1}  # an external server: its cap
    assert apply_pool_limits(project_instance, pool_limits(external)) == {"cpu_lane": 4, "gpu_lane": 1}
    assert apply_pool_limits(project_instance, pool_limits(settings)) == {"cpu_lane": 2, "gpu_lane": 1}
    assert project_instance.event_log_storage.get_concurrency_info(GPU_POOL).slot_count == 1


QUICK = textwrap.dedent(
    """
    from dagster import DagsterInstance, Definitions, asset, define_asset_job
    from lanes_pipeline.deploy.instance import in_process_run_tags

    @asset(pool="gpu_lane")
    def quick_gpu_step() -> None:
        return None

    job = Definitions(assets=[quick_gpu_step], jobs=[define_asset_job("quick", "*")]).resolve_job_def("quick")
    job.execute_in_process(instance=DagsterInstance.get(), tags=in_process_run_tags())
    """
)


class Waiting:
    """A new run with one gpu_lane step in a process of its own, as `lanes run` runs it (a thread of the
    test process inherited its signal state: its step's `tail -F` once ignored Dagster's SIGTERM)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", QUICK], env=os.environ.copy())

    def join(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)

    def is_alive(self) -> bool:
        return self.process.poll() is None


def start_gpu_step(instance: DagsterInstance) -> Waiting:
    """A new run with one gpu_lane step (alive until it has finished), on the instance of DAGSTER_HOME."""
    return Waiting()


def compute_log_tails(home: Path) -> list[str]:
    """Dagster's `tail -F` compute-log mirrors (and their orphan watchers) for runs of the instance at `home`:
    a run's step starts them and its end stops them."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        command = " ".join(process.info["cmdline"] or [])
        if str(home) in command and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(command)
    return found


def test_a_killed_run_does_not_hold_the_gpu_pool(project_instance: DagsterInstance, tmp_path: Path) -> None:
    apply_pool_limits(project_instance, {GPU_POOL: 1})
    claimed = tmp_path / "claimed"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(claimed)], env=os.environ.copy(), start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        while not claimed.exists() and time.monotonic() < deadline and holder.poll() is None:
            time.sleep(0.2)
        assert claimed.exists(), "the holder run never started its gpu_lane step"
        info = project_instance.event_log_storage.get_concurrency_info(GPU_POOL)
        assert info.active_slot_count == 1
        [held_by] = info.active_run_ids
        assert orphaned_runs(project_instance) == []  # alive: not touched
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the run and its step's compute-log tails, all at once
        holder.wait(timeout=30)

    # Dead, and still holding the only slot: a new gpu_lane step waits for it.
    assert project_instance.get_run_by_id(held_by).status == DagsterRunStatus.STARTED  # type: ignore[union-attr]
    waiting = start_gpu_step(project_instance)
    try:
        # Its run has started and stays blocked on the slot (not merely still importing).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not [
            r
            for r in project_instance.get_runs()
            if r.job_name == "quick" and r.status == DagsterRunStatus.STARTED
        ]:
            time.sleep(0.5)
        waiting.join(5)
        assert waiting.is_alive()
        [quick] = [r for r in project_instance.get_runs() if r.job_name == "quick"]
        assert quick.status == DagsterRunStatus.STARTED

        assert release_orphaned_runs(project_instance) == [held_by]  # what `lanes run` / `lanes dev` do first
        assert project_instance.get_run_by_id(held_by).status == DagsterRunStatus.FAILURE  # type: ignore[union-attr]
        waiting.join(120)
        assert not waiting.is_alive(), "the waiting gpu_lane step never got the freed slot"
        assert project_instance.event_log_storage.get_concurrency_info(GPU_POOL).active_slot_count == 0
        assert release_orphaned_runs(project_instance) == []  # idempotent
    finally:
        # Whatever happened above, the waiting run ends here, so its step's `tail -F` processes do not
        # outlive the test (they would run until the test session ends).
        if waiting.is_alive():
            release_orphaned_runs(project_instance)
            waiting.join(120)
    home = Path(os.environ["DAGSTER_HOME"])
    # The tails end when Dagster's watcher sees their step end; on two busy cores that took over 10 s once.
    deadline = time.monotonic() + 30
    while compute_log_tails(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert compute_log_tails(home) == []

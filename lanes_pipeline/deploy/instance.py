"""The project's Dagster instance: where it lives, its pool limits, and the slots of runs that crashed.

`make run` and `make dev` share one persistent instance (`DAGSTER_HOME`, default `data/dagster_home`, which
links to the project's `dagster.yaml`), so the UI shows the runs the CLI made.

Pools: CPU-lane steps declare `pool="cpu_lane"`, GPU-lane steps `pool="gpu_lane"`. The CPU lane's limit is
its server's slots (from the configs), the GPU lane's is one (one GPU: training, evaluation and serving
take turns). Pool limits live in the instance's storage, not in dagster.yaml, so `lanes run` and `lanes dev`
set them each time from the configs.

Crashed runs: the daemon's run monitoring frees the pool slots of runs it launched. A run `lanes run`
executes in its own process has no daemon watching it; it carries its pid in tags, and the next `lanes run`
or `lanes dev` marks such a run failed and frees its slots when that process is gone, so a limit-1 pool
cannot stay claimed by a dead process.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

import psutil
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from lanes_pipeline.deploy.instance_storage import check_instance_storage
from lanes_pipeline.settings import Settings

CPU_POOL, GPU_POOL = "cpu_lane", "gpu_lane"
# Tags of a run executed in the `lanes run` process itself: who to ask whether it is still alive.
PID_TAG, HOST_TAG, STARTED_TAG = "lanes/pid", "lanes/host", "lanes/process_started"
# The states of a run that may still hold pool slots (Dagster's own list of them is private).
NOT_FINISHED = [
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.SUSPENDED,
    DagsterRunStatus.CANCELING,
]


def use_project_instance(settings: Settings) -> Path:
    """Point DAGSTER_HOME at the project's persistent instance (data/dagster_home with our dagster.yaml),
    so runs made here show up in `make dev`, unless the user already chose one."""
    home = Path(os.environ.get("DAGSTER_HOME") or settings.data_dir / "dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    link, source = home / "dagster.yaml", settings.project_root / "dagster.yaml"
    if not link.exists() and source.exists():
        link.symlink_to(source)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def pool_limits(settings: Settings) -> dict[str, int]:
    """`cpu_lane`: the CPU lane's slots (its cap, and for an embedded server no more than its -np; with
    several endpoints the sum of their slots); `gpu_lane`: one."""
    cpu = settings.lanes.cpu_lane
    slots = min(cpu.max_slots, cpu.embedded.parallel) if cpu.is_embedded else cpu.total_slots
    return {CPU_POOL: slots, GPU_POOL: 1}


def apply_pool_limits(instance: DagsterInstance, limits: Mapping[str, int]) -> dict[str, int]:
    """Set each pool's limit on the instance; return the limits it now has."""
    storage = instance.event_log_storage
    for pool, limit in limits.items():
        storage.set_concurrency_slots(pool, limit)
    return {info.name: info.limit for info in storage.get_pool_limits() if info.name in limits}


def in_process_run_tags() -> dict[str, str]:
    """Tags for a run executed in this process: enough to tell later whether this process still lives."""
    me = psutil.Process()
    return {PID_TAG: str(me.pid), HOST_TAG: socket.gethostname(), STARTED_TAG: f"{me.create_time():.3f}"}


def _process_alive(tags: Mapping[str, str]) -> bool:
    """The process named by the tags still runs (the same one: a reused pid has another start time)."""
    try:
        process = psutil.Process(int(tags[PID_TAG]))
        return abs(process.create_time() - float(tags[STARTED_TAG])) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
        return False


def orphaned_runs(instance: DagsterInstance) -> list[DagsterRun]:
    """Unfinished runs executed in a `lanes run` process on this host that no longer exists."""
    runs = instance.get_runs(RunsFilter(statuses=NOT_FINISHED, tags={HOST_TAG: socket.gethostname()}))
    return [run for run in runs if PID_TAG in run.tags and not _process_alive(run.tags)]


def release_orphaned_runs(instance: DagsterInstance) -> list[str]:
    """Mark each orphaned run failed and free the pool slots it held; return their run ids."""
    released = []
    for run in orphaned_runs(instance):
        instance.report_run_failed(
            run, message=f"its process (pid {run.tags[PID_TAG]}) ended without finishing the run"
        )
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    return released


def prepare_instance(settings: Settings) -> tuple[DagsterInstance, dict[str, int], list[str]]:
    """The project instance with pool limits from the configs and no slot held by a dead run."""
    if home := os.environ.get("DAGSTER_HOME"):
        # A Postgres-backed instance (dagster.postgres.yaml): unset variables or a server that does not answer
        # are a ConfigError naming them, not Dagster's traceback.
        check_instance_storage(Path(home), os.environ)
    instance = DagsterInstance.get()
    released = release_orphaned_runs(instance)
    limits = apply_pool_limits(instance, pool_limits(settings))
    return instance, limits, released

"""The daily schedule: its time comes from configs/pipeline.yaml, and each tick runs `daily_lanes` for the
day that has just ended. The job covers every asset of the code location."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from dagster import AssetKey, DefaultScheduleStatus, build_schedule_context

from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.definitions import build_definitions
from lanes_pipeline.loop.schedules import DAILY_SCHEDULE
from lanes_pipeline.settings import Settings


def _with_schedule(settings: Settings, **changes: object) -> Settings:
    return dataclasses.replace(settings, pipeline=settings.pipeline.model_copy(update=changes))


@pytest.mark.parametrize(
    ("tick", "partition"),
    [
        (datetime(2026, 11, 21, 4, 0, tzinfo=UTC), "2026-11-20"),
        (datetime(2026, 12, 1, 4, 0, tzinfo=UTC), "2026-11-30"),  # across a month
        (datetime(2027, 1, 1, 4, 0, tzinfo=UTC), "2026-12-31"),  # and a year
    ],
)
def test_a_tick_runs_daily_lanes_for_the_previous_day(
    settings: Settings, tick: datetime, partition: str
) -> None:
    defs = build_definitions(settings)
    schedule = defs.resolve_schedule_def(DAILY_SCHEDULE)
    with build_schedule_context(scheduled_execution_time=tick) as context:
        result = schedule.evaluate_tick(context)
    assert result.run_requests is not None
    [request] = result.run_requests
    assert request.partition_key == partition
    assert schedule.job_name == "daily_lanes"


def test_the_schedule_time_comes_from_the_configs(settings: Settings) -> None:
    shipped = build_definitions(settings).resolve_schedule_def(DAILY_SCHEDULE)
    assert shipped.cron_schedule == "0 4 * * *"  # configs/pipeline.yaml: early morning
    assert shipped.execution_timezone == "UTC"
    assert shipped.default_status == DefaultScheduleStatus.RUNNING

    moved = _with_schedule(settings, schedule_hour=6, schedule_minute=30, schedule_enabled=False)
    schedule = build_definitions(moved).resolve_schedule_def(DAILY_SCHEDULE)
    assert schedule.cron_schedule == "30 6 * * *"
    assert schedule.default_status == DefaultScheduleStatus.STOPPED
    with build_schedule_context(scheduled_execution_time=datetime(2026, 11, 21, 6, 30, tzinfo=UTC)) as ctx:
        [request] = schedule.evaluate_tick(ctx).run_requests or []
    assert request.partition_key == "2026-11-20"


def test_daily_lanes_covers_every_asset_with_retries_on_each_step(settings: Settings) -> None:
    defs = build_definitions(settings)
    job = defs.resolve_job_def("daily_lanes")
    every_asset = set(defs.get_repository_def().asset_graph.materializable_asset_keys)
    # every asset but the lane benchmark, which runs in a daily job of its own (an hour earlier)
    assert set(job.asset_layer.executable_asset_keys) == every_asset - {AssetKey("lane_benchmarks")}
    benchmarks = defs.resolve_job_def("lane_benchmarks_daily")
    assert set(benchmarks.asset_layer.executable_asset_keys) == {AssetKey("lane_benchmarks")}
    assert job.partitions_def is not None and job.partitions_def.get_partition_keys()[0] == "2026-11-01"
    policy = job.op_retry_policy  # every step: a lane that restarts mid-step gets the step retried later
    assert policy is not None and policy.max_retries >= 1 and policy.delay
    assert job.run_tags["lanes/job"] == "daily_lanes"  # dagster.yaml: one daily_lanes run at a time


def test_every_lane_step_sits_in_its_lane_pool_and_retries_in_any_job(settings: Settings) -> None:
    """Pools bound the lanes across runs; the retry policy sits on the assets themselves, so the runs of a
    UI backfill (Dagster's implicit asset job, not daily_lanes) retry a lane call too."""
    lane_assets = [
        a for a in build_definitions(settings).assets or [] if getattr(a, "op", None) and a.op.pool
    ]
    assert {a.op.pool for a in lane_assets} == {"cpu_lane", "gpu_lane"}
    assert {a.key.to_user_string() for a in lane_assets} >= {
        "repo_analysis",
        "lora_adapter",
        "served_adapter",
    }
    for asset in lane_assets:
        assert asset.op.retry_policy == LANE_RETRY, asset.key

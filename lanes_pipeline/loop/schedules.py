"""The daily schedule: early each morning (`pipeline.schedule_hour`:`schedule_minute`, in the partitions'
time zone), `daily_lanes` for the day that has just ended.

The scheduler catches up only a few missed ticks, and none from before it was switched on: days the machine
was off are filled by a backfill (README, "Daily use").
"""

# No `from __future__ import annotations` here: a module that defines Dagster schedules keeps its
# annotations real, like the asset modules.
from dagster import DefaultScheduleStatus, ScheduleDefinition, build_schedule_from_partitioned_job

from lanes_pipeline.loop.jobs import daily_lanes_job, lane_benchmarks_job
from lanes_pipeline.settings import Settings

DAILY_SCHEDULE = "daily_lanes_schedule"


# The return type is Dagster's unresolved schedule of an asset job, which its public API does not export.
def daily_schedule(settings: Settings):
    pipeline = settings.pipeline
    status = DefaultScheduleStatus.RUNNING if pipeline.schedule_enabled else DefaultScheduleStatus.STOPPED
    # A daily partitioned job: each tick targets the latest *completed* day, i.e. yesterday.
    schedule = build_schedule_from_partitioned_job(
        daily_lanes_job,
        name=DAILY_SCHEDULE,
        hour_of_day=pipeline.schedule_hour,
        minute_of_hour=pipeline.schedule_minute,
        default_status=status,
        description=(
            f"daily_lanes for yesterday, every day at {pipeline.schedule_hour:02d}:"
            f"{pipeline.schedule_minute:02d} {pipeline.timezone} (configs/pipeline.yaml)"
        ),
    )
    # An asset job takes its partitions from its assets: the schedule resolves with the code location.
    return schedule


def lane_benchmarks_schedule(settings: Settings) -> ScheduleDefinition:
    """The lane benchmark an hour before the day's work, so the two never share the lanes."""
    pipeline = settings.pipeline
    status = DefaultScheduleStatus.RUNNING if pipeline.schedule_enabled else DefaultScheduleStatus.STOPPED
    hour = (pipeline.schedule_hour - 1) % 24
    return ScheduleDefinition(
        name="lane_benchmarks_schedule",
        job=lane_benchmarks_job,
        cron_schedule=f"{pipeline.schedule_minute} {hour} * * *",
        execution_timezone=pipeline.timezone,
        default_status=status,
    )

"""The daily partitions every pipeline asset shares, from `configs/pipeline.yaml`."""

from __future__ import annotations

from dagster import DailyPartitionsDefinition

from lanes_pipeline.settings import Settings, load_settings


def daily_partitions(settings: Settings) -> DailyPartitionsDefinition:
    # end_offset=0: the latest partition is the latest *completed* day, which the schedule fills.
    return DailyPartitionsDefinition(
        start_date=settings.pipeline.start_date.isoformat(), timezone=settings.pipeline.timezone
    )


DAILY = daily_partitions(load_settings())

"""The daily partitions every pipeline asset shares, from `configs/pipeline.yaml`.

Built when the definitions load (`definitions.py`), never at import: a test or a second deployment with
another config folder gets its own start date and time zone.
"""

from __future__ import annotations

from collections.abc import Sequence

from dagster import AssetsDefinition, DailyPartitionsDefinition, TimeWindowPartitionMapping, map_asset_specs

from lanes_pipeline.settings import Settings


def daily_partitions(settings: Settings) -> DailyPartitionsDefinition:
    # end_offset=0: the latest partition is the latest *completed* day, which the schedule fills.
    return DailyPartitionsDefinition(
        start_date=settings.pipeline.start_date.isoformat(), timezone=settings.pipeline.timezone
    )


def partitioned_daily(
    assets: Sequence[AssetsDefinition], partitions: DailyPartitionsDefinition
) -> list[AssetsDefinition]:
    """The lane assets are declared without partitions (their modules read no settings at import) and get
    the configured daily partitions here."""
    return list(map_asset_specs(lambda spec: spec.replace_attributes(partitions_def=partitions), assets))


def replay_window(replay_window_days: int) -> TimeWindowPartitionMapping:
    """The `replay_window_days` days of lora_dataset up to lora_adapter's own day; days before the first
    partition do not exist, which is fine (the first days train on what there is)."""
    return TimeWindowPartitionMapping(
        start_offset=-(replay_window_days - 1), end_offset=0, allow_nonexistent_upstream_partitions=True
    )


def previous_day() -> TimeWindowPartitionMapping:
    """Day D depends on day D-1 (the first day on nothing): what orders an asset's days in a backfill."""
    return TimeWindowPartitionMapping(
        start_offset=-1, end_offset=-1, allow_nonexistent_upstream_partitions=True
    )

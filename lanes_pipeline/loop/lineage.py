"""Dependencies declared when the definitions load, from the configuration: reads across days."""

from __future__ import annotations

from collections.abc import Sequence

from dagster import AssetDep, AssetsDefinition, AssetSpec, map_asset_specs

from lanes_pipeline.daily.partitions import replay_window
from lanes_pipeline.gpu_lane.assets import LORA_DATASET, lora_adapter


def with_training_window(
    assets: Sequence[AssetsDefinition], replay_window_days: int
) -> list[AssetsDefinition]:
    """lora_adapter's dependency on lora_dataset declared as what it reads: the replay window, from
    configs/training.yaml when the definitions load. Backfills stay one run per day because `lanes backfill`
    (and the README's UI route) submits a backfill of the daily_lanes job, whose runs each hold the whole
    job for their day; an asset backfill would split the GPU chain off into runs of its own."""
    window = replay_window(replay_window_days)

    def declare(spec: AssetSpec) -> AssetSpec:
        if spec.key != lora_adapter.key:
            return spec
        deps = [
            AssetDep(dep.asset_key, partition_mapping=window) if dep.asset_key == LORA_DATASET else dep
            for dep in spec.deps
        ]
        return spec.replace_attributes(deps=deps)

    return list(map_asset_specs(declare, assets))

"""Dependencies declared when the definitions load, from the configuration: reads across days."""

from __future__ import annotations

from collections.abc import Sequence

from dagster import AssetDep, AssetsDefinition, AssetSpec, map_asset_specs

from lanes_pipeline.daily.partitions import replay_window
from lanes_pipeline.gpu_lane.assets import LORA_DATASET, adapter_evaluation, lora_adapter


def with_training_window(
    assets: Sequence[AssetsDefinition], replay_window_days: int
) -> list[AssetsDefinition]:
    """The dependency on lora_dataset of lora_adapter (its training rows) and adapter_evaluation (its
    held-out eval rows) declared as what they read: the replay window, from configs/training.yaml when the
    definitions load. Both read it through the mapping (dataset/window.py), so it is written only here."""
    window = replay_window(replay_window_days)

    def declare(spec: AssetSpec) -> AssetSpec:
        if spec.key not in (lora_adapter.key, adapter_evaluation.key):
            return spec
        deps = [
            AssetDep(dep.asset_key, partition_mapping=window) if dep.asset_key == LORA_DATASET else dep
            for dep in spec.deps
        ]
        return spec.replace_attributes(deps=deps)

    return list(map_asset_specs(declare, assets))

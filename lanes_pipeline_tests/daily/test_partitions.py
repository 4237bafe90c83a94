"""lora_adapter declares the replay window of lora_dataset it reads, as a time-window partition mapping
with the window from configs/training.yaml, when the definitions load; the GPU lane's judgement and serving
each depend on their own day before. Fast: nothing runs."""

from __future__ import annotations

from dataclasses import replace

from dagster import AssetKey, TimeWindowPartitionMapping

from lanes_pipeline.definitions import daily_assets
from lanes_pipeline.settings import Settings

DATASET = AssetKey("lora_dataset")


def _window(settings: Settings) -> TimeWindowPartitionMapping:
    adapter = daily_assets(settings)["lora_adapter"]
    mapping = adapter.get_partition_mapping(DATASET)
    assert isinstance(mapping, TimeWindowPartitionMapping)
    return mapping


def test_lora_adapter_declares_the_configured_window_of_lora_dataset(settings: Settings) -> None:
    days = settings.training.replay_window_days
    mapping = _window(settings)
    assert (mapping.start_offset, mapping.end_offset) == (-(days - 1), 0)
    assert mapping.allow_nonexistent_upstream_partitions
    three = replace(settings, training=settings.training.model_copy(update={"replay_window_days": 3}))
    assert _window(three).start_offset == -2
    # The other lane assets keep their same-day dependencies.
    evaluation = daily_assets(settings)["adapter_evaluation"]
    assert not isinstance(
        evaluation.get_partition_mapping(AssetKey("lora_adapter")), TimeWindowPartitionMapping
    )


def test_the_gpu_lane_judges_and_serves_the_days_in_order(settings: Settings) -> None:
    """adapter_evaluation(D) depends on adapter_evaluation(D-1) and served_adapter(D) on served_adapter(D-1):
    what orders the days of an asset backfill (the first day depends on nothing)."""
    graph = daily_assets(settings)
    for name in ("adapter_evaluation", "served_adapter"):
        definition = graph[name]
        mapping = definition.get_partition_mapping(AssetKey(name))
        assert isinstance(mapping, TimeWindowPartitionMapping), name
        assert (mapping.start_offset, mapping.end_offset) == (-1, -1)
        assert mapping.allow_nonexistent_upstream_partitions
        partitions = definition.partitions_def
        assert partitions is not None
        first, second = partitions.get_partition_keys()[:2]
        upstream = mapping.get_upstream_mapped_partitions_result_for_partitions(
            partitions.subset_with_partition_keys([second]), partitions, partitions
        ).partitions_subset.get_partition_keys()
        assert list(upstream) == [first]

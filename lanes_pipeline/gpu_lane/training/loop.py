"""Our training loop: AdamW on the LoRA weights, linear warmup and decay, gradient accumulation, the loss on
assistant tokens only, optional packing, and the checkpoint chosen by the validation rows' loss (a small
window is memorised within a few epochs: the step where the held-aside rows were predicted best is kept,
not the last). Runs in the trainer process."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

from lanes_pipeline.gpu_lane.training.data import Example, batches, collate, pack
from lanes_pipeline.gpu_lane.training.model import assistant_loss, peft_model, shifted_label_count, tensors
from lanes_pipeline.gpu_lane.training.progress import Progress
from lanes_pipeline.gpu_lane.training.world import Single, World
from lanes_pipeline.settings import TrainingConfig


def _epoch_stream(
    sequences: Sequence[Example], training: TrainingConfig, rng: random.Random
) -> Iterator[list[Example]]:
    while True:
        yield from batches(sequences, training.batch_size, rng, group_by_length=training.group_by_length)


def total_steps(training: TrainingConfig, num_sequences: int) -> int:
    """`max_steps` when set; else the steps `epochs` passes over the sequences make, within `step_range`."""
    if training.max_steps is not None:
        return training.max_steps
    micro = math.ceil(num_sequences / training.batch_size)
    steps = math.ceil((training.epochs or 1.0) * micro / training.gradient_accumulation_steps)
    return min(training.step_range.max, max(training.step_range.min, steps))


def warmup_steps(training: TrainingConfig, steps: int) -> int:
    return training.warmup_steps if training.warmup_steps is not None else steps // 10


def checkpoint_steps(steps: int, checkpoints: int) -> list[int]:
    """The steps (1-based) where the adapter is scored: spread evenly, the last step always among them."""
    return sorted({max(1, round(steps * i / checkpoints)) for i in range(1, checkpoints + 1)})


def linear_schedule(step: int, warmup: int, total: int) -> float:
    """The factor on the learning rate at `step` (0-based): linear warmup, then linear decay to 0 (as HF)."""
    if step < warmup:
        return (step + 1) / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def train_loop(
    training: TrainingConfig,
    base_model_dir: str,
    tokenizer: Any,
    examples: list[Example],
    device: Any,
    dtype: Any,
    progress: Progress,
    world: World | None = None,
    validation: Sequence[Example] = (),
    init_adapter: str | None = None,
) -> dict[str, Any]:
    """Every process of a `world` runs this on the same examples; see world.py for how they share a step.
    Counts (tokens, curve) are of the whole step, the same in every process. With `validation` rows the
    adapter is scored on them at each checkpoint and the best one is what the model holds at the end."""
    import torch

    world = world or Single()

    model = peft_model(base_model_dir, training, device, dtype, init_adapter)
    sequences = pack(examples, training.max_seq_len) if training.packing else examples
    steps = total_steps(training, len(sequences))
    params = [p for p in model.parameters() if p.requires_grad]
    world.sync_parameters(params)
    optimizer = torch.optim.AdamW(params, lr=training.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: linear_schedule(s, warmup_steps(training, steps), steps)
    )
    scored_at = set(checkpoint_steps(steps, training.checkpoints)) if validation else set()
    validation_curve: list[tuple[int, float]] = []
    best: tuple[float, int, list[Any]] | None = None
    stream = _epoch_stream(sequences, training, random.Random(training.seed))
    pad_id = tokenizer.pad_token_id
    model.train()
    curve: list[tuple[int, float]] = []
    tokens = trained = padded = micro_batches = 0
    started = time.perf_counter()
    for step in range(1, steps + 1):
        drawn = [next(stream) for _ in range(training.gradient_accumulation_steps)]
        group = [collate(rows, pad_id, training.packing) for rows in drawn]
        items = sum(shifted_label_count(batch) for batch in group)
        step_loss = 0.0
        for rows, batch in zip(drawn, group, strict=True):
            mine = world.shard(rows)
            if mine:
                own = batch if len(mine) == len(rows) else collate(mine, pad_id, training.packing)
                loss = assistant_loss(model, tensors(own, device), max(1, items))
                loss.backward()
                step_loss += float(loss.detach())
            tokens += batch.real_tokens
            padded += sum(len(row) for row in batch.input_ids)
            micro_batches += 1
        trained += items
        world.sum_gradients(params)  # the whole group's gradient, in every process
        step_loss = world.sum(step_loss)  # each process's share of the group's token mean
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        curve.append((step, round(step_loss, 5)))
        if step in scored_at:
            loss = validation_loss(model, validation, pad_id, device)
            validation_curve.append((step, round(loss, 5)))
            if best is None or loss < best[0]:
                best = (loss, step, [p.detach().clone() for p in params])
            progress.event("validation", step=step, loss=round(loss, 5), best_step=best[1])
        elapsed = time.perf_counter() - started
        progress.event(
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
    if best is not None:
        with torch.no_grad():
            for param, kept in zip(params, best[2], strict=True):
                param.copy_(kept)
    return {
        "chosen_step": best[1] if best is not None else steps,
        "validation_curve": validation_curve,
        "model": model,
        "steps": steps,
        "epochs": micro_batches * training.batch_size / max(1, len(sequences)),
        "sequences": len(sequences),
        "tokens": tokens,
        "trained_tokens": trained,
        "padded_tokens": padded,
        "train_s": train_s,
        "curve": curve,
    }


def validation_loss(model: Any, validation: Sequence[Example], pad_id: int, device: Any) -> float:
    """Mean loss per labelled token of the validation rows (the model back in training mode after)."""
    import torch

    model.eval()
    total = items = 0.0
    with torch.no_grad():
        for example in validation:
            batch = collate([example], pad_id, packed=False)
            count = shifted_label_count(batch)
            total += float(assistant_loss(model, tensors(batch, device), 1))
            items += count
    model.train()
    return total / max(1.0, items)

"""Our training loop: AdamW on the LoRA weights, linear warmup and decay, gradient accumulation, the loss on
assistant tokens only, optional packing. Runs in the trainer process."""

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
    if training.max_steps is not None:
        return training.max_steps
    micro = math.ceil(num_sequences / training.batch_size)
    return max(1, math.ceil((training.epochs or 1.0) * micro / training.gradient_accumulation_steps))


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
) -> dict[str, Any]:
    """Every process of a `world` runs this on the same examples; see world.py for how they share a step.
    Counts (tokens, curve) are of the whole step, the same in every process."""
    import torch

    world = world or Single()

    model = peft_model(base_model_dir, training, device, dtype)
    sequences = pack(examples, training.max_seq_len) if training.packing else examples
    steps = total_steps(training, len(sequences))
    params = [p for p in model.parameters() if p.requires_grad]
    world.sync_parameters(params)
    optimizer = torch.optim.AdamW(params, lr=training.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: linear_schedule(s, training.warmup_steps, steps)
    )
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
    return {
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

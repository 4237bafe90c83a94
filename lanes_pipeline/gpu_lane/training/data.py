"""Turning chat rows into training tensors: loss on assistant tokens only, optional packing. Pure functions.

The chat template renders a conversation; each assistant turn is the text between the template rendered up
to the turn with a generation prompt and the template rendered with the turn (its end-of-turn marker
included, so the model learns to stop). Token labels come from the fast tokenizer's character offsets.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

IGNORE = -100


class ChatTokenizer(Protocol):
    is_fast: bool
    pad_token_id: int | None
    eos_token_id: int | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]  # IGNORE where the loss must not look
    position_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.position_ids:
            object.__setattr__(self, "position_ids", list(range(len(self.input_ids))))

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def trained_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE)


def _render(tokenizer: ChatTokenizer, messages: Sequence[dict[str, str]], generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=generation_prompt
    )
    return str(text)


def assistant_spans(
    tokenizer: ChatTokenizer, messages: Sequence[dict[str, str]]
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns."""
    full = _render(tokenizer, messages, generation_prompt=False)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:index], generation_prompt=True)
        through = _render(tokenizer, messages[: index + 1], generation_prompt=False)
        if full.startswith(before) and full.startswith(through) and len(through) > len(before):
            spans.append((len(before), len(through)))
            cursor = len(through)
            continue
        # A template that rewrites earlier turns (some drop reasoning from old turns): find the content.
        start = full.find(message["content"], cursor)
        if start < 0:
            raise ValueError(f"assistant turn {index} not found in the rendered conversation")
        spans.append((start, start + len(message["content"])))
        cursor = start + len(message["content"])
    return full, spans


def label_tokens(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """For each token (by its character offsets), whether it starts inside an assistant span."""
    marks = []
    for start, end in offsets:
        inside = any(span_start <= start < span_end for span_start, span_end in spans) and end > start
        marks.append(inside)
    return marks


def encode_chat(tokenizer: ChatTokenizer, messages: Sequence[dict[str, str]], max_len: int) -> Example | None:
    """Tokens and labels of one conversation, cut to `max_len`; None if no assistant token survives."""
    if not tokenizer.is_fast:
        raise ValueError("assistant-only loss needs a fast tokenizer (tokenizer.json) for character offsets")
    text, spans = assistant_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(encoded["input_ids"])[:max_len]
    marks = label_tokens(encoded["offset_mapping"], spans)[:max_len]
    labels = [token if mark else IGNORE for token, mark in zip(ids, marks, strict=True)]
    example = Example(input_ids=ids, labels=labels)
    return example if example.trained_tokens else None


def encode_continuation(
    tokenizer: ChatTokenizer, prompt: str, continuation: str, max_len: int
) -> Example | None:
    """Tokens and labels of a completion row: the raw text an editor sends (no chat template: the GPU
    lane's completions endpoint sends none) and its continuation, the loss on the continuation only. Cut
    from the left to `max_len` (the text right before the continuation is what it depends on); None if no
    continuation token is left."""
    if not tokenizer.is_fast:
        raise ValueError(
            "continuation-only loss needs a fast tokenizer (tokenizer.json) for character offsets"
        )
    text = prompt + continuation
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    marks = label_tokens(encoded["offset_mapping"], [(len(prompt), len(text))])
    ids: list[int] = list(encoded["input_ids"])
    labels = [token if mark else IGNORE for token, mark in zip(ids, marks, strict=True)]
    example = Example(input_ids=ids[-max_len:], labels=labels[-max_len:])
    return example if example.trained_tokens else None


def encode_row(tokenizer: ChatTokenizer, row: dict[str, Any], max_len: int) -> Example | None:
    """A dataset row as the trainer sees it: a "complete" row as raw text and its continuation (its user
    message is the prompt, its assistant message the continuation), every other kind as a chat."""
    if row["task"] == "complete":
        by_role = {m["role"]: m["content"] for m in row["messages"]}
        return encode_continuation(tokenizer, by_role["user"], by_role["assistant"], max_len)
    return encode_chat(tokenizer, row["messages"], max_len)


def validation_split(
    rows: Sequence[dict[str, Any]], percent: int, minimum: int = 2
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, validation rows): the rows whose content hash falls in `percent` are set aside to
    choose the checkpoint, the same ones whatever the order; fewer than `minimum` of them choose nothing
    reliably, so then every row trains."""
    aside = [r for r in rows if int(r["content_hash"][:8], 16) % 100 < percent]
    if len(aside) < minimum:
        return list(rows), []
    kept = {r["content_hash"] for r in aside}
    return [r for r in rows if r["content_hash"] not in kept], aside


def pack(examples: Sequence[Example], max_len: int) -> list[Example]:
    """First-fit-decreasing bins of at most `max_len` tokens. Positions restart in every example, which
    transformers reads as separate sequences (a block-diagonal mask): no attention across examples."""
    bins: list[list[Example]] = []
    room: list[int] = []
    for example in sorted(examples, key=len, reverse=True):
        for index, free in enumerate(room):
            if len(example) <= free:
                bins[index].append(example)
                room[index] -= len(example)
                break
        else:
            bins.append([example])
            room.append(max_len - len(example))
    packed = []
    for members in bins:
        packed.append(
            Example(
                input_ids=[t for e in members for t in e.input_ids],
                labels=[t for e in members for t in e.labels],
                position_ids=[p for e in members for p in e.position_ids],
            )
        )
    return packed


def batches(
    examples: Sequence[Example], batch_size: int, rng: random.Random, group_by_length: bool = True
) -> list[list[Example]]:
    """One epoch of batches. Grouping similar lengths (sorted within shuffled chunks of 16 batches) cuts
    padding; the batch order is shuffled, so the model does not see lengths in order."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    if group_by_length:
        chunk = batch_size * 16
        order = [
            i
            for start in range(0, len(order), chunk)
            for i in sorted(order[start : start + chunk], key=lambda i: len(examples[i]), reverse=True)
        ]
    grouped = [
        [examples[i] for i in order[start : start + batch_size]] for start in range(0, len(order), batch_size)
    ]
    rng.shuffle(grouped)
    return grouped


@dataclass(frozen=True)
class Collated:
    input_ids: list[list[int]]
    labels: list[list[int]]
    position_ids: list[list[int]]
    attention_mask: list[list[int]] | None  # None for packed rows: the positions carry the boundaries
    real_tokens: int


def collate(batch: Sequence[Example], pad_id: int, packed: bool) -> Collated:
    """Right-pad to the longest row. Padding gets label IGNORE; in packed rows it gets positions of its own,
    so it forms a separate (ignored) sequence instead of joining the last example."""
    width = max(len(e) for e in batch)
    ids, labels, positions, mask = [], [], [], []
    for e in batch:
        gap = width - len(e)
        ids.append(e.input_ids + [pad_id] * gap)
        labels.append(e.labels + [IGNORE] * gap)
        positions.append(e.position_ids + list(range(gap)))
        mask.append([1] * len(e) + [0] * gap)
    real = sum(len(e) for e in batch)
    return Collated(ids, labels, positions, None if packed else mask, real)


@dataclass(frozen=True)
class DatedRow:
    day: int  # the index of the row's (latest) day in the window, oldest first
    row: dict[str, Any]


def dated_rows(rows_by_day: Sequence[Sequence[dict[str, Any]]]) -> list[DatedRow]:
    """The window's rows (one list per day, oldest first), each content_hash once with the latest day that
    has it, in the window's order (as dataset.window.dedupe): the day is what the eval sample stratifies
    on, and a row held out again today counts as today's."""
    latest: dict[str, DatedRow] = {}
    for day, rows in enumerate(rows_by_day):
        for row in rows:
            latest.pop(row["content_hash"], None)  # re-insert: dict order follows the latest day
            latest[row["content_hash"]] = DatedRow(day, row)
    return list(latest.values())


def eval_sample(rows: Sequence[DatedRow], max_samples: int) -> list[dict[str, Any]]:
    """The held-out rows the eval loss is measured on: all of them when there are at most `max_samples`,
    else a stratified sample of exactly `max_samples`. Pure and deterministic.

    Taking the first rows (oldest day first) left out the newest day, the one the candidate adapter was
    trained for, as soon as the window held more than `max_samples`, and let the most frequent kind
    (templated explanations) dominate the number. Instead the rows are grouped by (task kind, day) and the
    samples dealt out one per group per round (so a small group is taken whole and the rest shared evenly
    among the larger ones). The groups are dealt in the order: each kind's newest day, newest first (the
    newest day's kinds lead, then each kind missing from it), then each kind's next-newest day, and so on;
    so the newest day and every kind are in the sample even when there are more groups than samples, and
    every group is when there are not. Within a group the rows go by content_hash (a hash of the row: a
    stable order that favours no source or position). The rows come back in the window's order."""
    if len(rows) <= max_samples:
        return [dated.row for dated in rows]
    groups: dict[tuple[str, int], list[str]] = {}
    for dated in rows:
        groups.setdefault((dated.row["task"], dated.day), []).append(dated.row["content_hash"])
    days_of_kind: dict[str, list[int]] = {}
    for task, day in groups:
        days_of_kind.setdefault(task, []).append(day)

    def deal_order(group: tuple[str, int]) -> tuple[int, int, str]:
        task, day = group
        newer = sum(1 for other in days_of_kind[task] if other > day)
        return newer, -day, task

    order = sorted(groups, key=deal_order)
    taken = dict.fromkeys(order, 0)
    left = max_samples
    while left:  # ends: there are more rows than max_samples
        for group in order:
            if left and taken[group] < len(groups[group]):
                taken[group] += 1
                left -= 1
    chosen = {digest for group in order for digest in sorted(groups[group])[: taken[group]]}
    return [dated.row for dated in rows if dated.row["content_hash"] in chosen]

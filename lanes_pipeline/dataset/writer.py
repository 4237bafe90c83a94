"""The daily LoRA dataset: accepted CPU-lane results -> chat records, scrubbed, deduplicated, fitted to the
GPU-lane base model's length with its own tokenizer, rows of held-out symbols in eval only, saved
with `datasets`.

The rows follow the contract (contract.py); the trainer reads them back through window.py.

Everything here is pure except `load_token_counter` and `save_dataset`; the order of every step is fixed, so
equal inputs give equal rows and byte-identical files.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.daily.artifacts import Figures
from lanes_pipeline.dataset.contract import (
    TASKS,
    Record,
    Task,
    at_cut,
    check_row,
    content_hash,
    features,
    user_prompt,
)
from lanes_pipeline.sandbox.safety import injection_markers, secret_findings
from lanes_pipeline.store import canonical_json, sha256_bytes

# The CPU lane's accepted work of a day as the dataset reads it: accepted_work/<day>/accepted.json.
ACCEPTED_WORK, ACCEPTED_FILE = "accepted_work", "accepted.json"
CUT_MARK = "# ... (rest of the file cut to fit)"
SHINGLE_WORDS = 5

TokenCounter = Callable[[list[dict[str, str]]], int]


class Candidate(BaseModel):
    """One accepted CPU-lane result, before it becomes a chat record."""

    model_config = ConfigDict(frozen=True)

    task: Task
    repo: str
    path: str
    code: str
    answer: str
    symbol: str | None = None
    code_is_file: bool = Field(
        True,
        description="`code` is the whole file (held-out bodies in it are masked for training); False for "
        "a symbol shown with its context, which holds no other body",
    )
    held_out: bool = Field(
        False,
        description="about a held-out symbol: eval split only (holdout_rules.py decides, the asset sets it)",
    )

    def sort_key(self) -> tuple[str, ...]:
        return (self.task, self.repo, self.path, sha256_bytes(self.answer.encode()))


class AcceptedWork(Frozen):
    """What the CPU lane hands the dataset for a day (the `accepted_work` asset): its accepted results as
    candidates, and the accepted test modules of each symbol, which judge the held-out tasks."""

    candidates: list[Candidate] = Field(default_factory=list)
    tests: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict, description="repo -> symbol name -> the day's accepted test modules for it"
    )


class Dropped(BaseModel):
    task: Task
    repo: str
    path: str
    reason: Literal["secret", "prompt_injection", "too_long", "duplicate", "near_duplicate", "over_share"]
    detail: str = ""


class DatasetFigures(Figures):
    """lora_dataset's figures, which `lanes run`'s summary reads."""

    candidates: int = 0
    train_rows: int = 0
    eval_rows: int = 0
    row_count: int = Field(0, alias="dagster/row_count")


class ShapedDataset(BaseModel):
    train: list[Record]
    eval: list[Record]
    dropped: list[Dropped]
    cut_to_fit: int

    def counts(self) -> dict[str, int]:
        counts = {"train_rows": len(self.train), "eval_rows": len(self.eval), "cut_to_fit": self.cut_to_fit}
        for reason in ("secret", "prompt_injection", "too_long", "duplicate", "near_duplicate", "over_share"):
            counts[f"dropped_{reason}"] = sum(d.reason == reason for d in self.dropped)
        for task in TASKS:
            counts[f"rows_{task}"] = sum(r.task == task for r in [*self.train, *self.eval])
        return counts

    def train_shares(self) -> dict[str, float]:
        """Each kind's share of the training rows (what max_share caps)."""
        total = len(self.train)
        return {
            task: round(sum(r.task == task for r in self.train) / total, 4) if total else 0.0
            for task in TASKS
        }


def render(candidate: Candidate, system_prompt: str, code: str | None = None) -> Record:
    if candidate.task == "complete":  # raw text and what follows it, verbatim (indentation is the answer)
        messages = [
            {"role": "user", "content": candidate.code if code is None else code},
            {"role": "assistant", "content": candidate.answer},
        ]
        return Record(messages=messages, task="complete", content_hash=content_hash(messages, "complete"))
    messages = [
        {"role": "system", "content": system_prompt},
        {
            "role": "user",
            "content": user_prompt(
                candidate.task, candidate.path, candidate.code if code is None else code, candidate.symbol
            ),
        },
        {"role": "assistant", "content": candidate.answer.strip()},
    ]
    return Record(messages=messages, task=candidate.task, content_hash=content_hash(messages, candidate.task))


def unsafe_reason(record: Record) -> tuple[Literal["secret", "prompt_injection"], str] | None:
    """Why a record must not be trained on: a secret (key, token, private key) or prompt-injection text."""
    text = record.text()
    secrets = secret_findings(text)
    if secrets:
        return "secret", ", ".join(secrets)
    markers = injection_markers(text)
    if markers:
        return "prompt_injection", "; ".join(markers[:3])
    return None


def fit(candidate: Candidate, system_prompt: str, count: TokenCounter, max_len: int) -> Record | None:
    """The record within `max_len` tokens: whole if it fits, else with the file cut at a line (the head
    kept, a mark added; for a completion row the tail kept, as an editor cuts it); None when even the
    empty file does not fit (the answer alone is too long)."""
    whole = render(candidate, system_prompt)
    if count(whole.messages) <= max_len:
        return whole
    if candidate.task == "complete":  # keep the prompt's first line (`# path`) and the lines before the cut
        head, *tail = candidate.code.splitlines(keepends=True)

        def cut(n: int) -> Record:
            return render(candidate, system_prompt, at_cut(head + "".join(tail[len(tail) - n :])))

        most = len(tail)
    else:  # keep the file's head, then a mark
        lines = candidate.code.splitlines()

        def cut(n: int) -> Record:
            return render(candidate, system_prompt, "\n".join([*lines[:n], CUT_MARK]))

        most = len(lines) - 1
    if count(cut(0).messages) > max_len:
        return None
    low, high = 0, most  # the most lines that fit lies in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if count(cut(middle).messages) <= max_len:
            low = middle
        else:
            high = middle - 1
    return cut(low)


def shingles(text: str, size: int = SHINGLE_WORDS) -> frozenset[str]:
    words = re.findall(r"\w+", text.lower())
    if len(words) <= size:
        return frozenset({" ".join(words)})
    return frozenset(" ".join(words[i : i + size]) for i in range(len(words) - size + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _compared_text(record: Record) -> str:
    """What near-duplicate detection compares: a completion row's continuation (rows cut in one file share
    most of their prompt and still teach different lines), every other row whole."""
    return record.messages[-1]["content"] if record.task == "complete" else record.text()


def near_duplicates(records: Sequence[Record], threshold: float) -> dict[int, int]:
    """index -> index of the earlier record it nearly duplicates (Jaccard of word shingles >= threshold).

    Exact pairwise Jaccard: days hold tens to hundreds of records, where this is instant and, unlike
    MinHash, has no sampling error that could flip a decision between runs. Records of different tasks are
    never duplicates of each other (the same code explained and tested teaches two different things).
    """
    sets = [shingles(_compared_text(r)) for r in records]
    kept: list[int] = []
    duplicate_of: dict[int, int] = {}
    for index, current in enumerate(sets):
        for earlier in kept:
            if records[earlier].task != records[index].task:
                continue
            smaller, larger = sorted((len(current), len(sets[earlier])))
            if larger and smaller / larger < threshold:
                continue  # Jaccard cannot reach the threshold: skip the set operations
            if jaccard(current, sets[earlier]) >= threshold:
                duplicate_of[index] = earlier
                break
        else:
            kept.append(index)
    return duplicate_of


def allowed_counts(tasks: Sequence[str], max_share: Mapping[str, float]) -> dict[str, int]:
    """How many rows of each kind stay so that every capped kind holds at most its share of the rows kept:
    a capped kind over its share is cut to it, which lowers the total and so the others' caps, until
    nothing moves (a fixed point: the counts only fall)."""
    allowed = dict(Counter(tasks))
    moved = True
    while moved:
        moved = False
        total = sum(allowed.values())
        for task, share in max_share.items():
            cap = math.floor(share * total + 1e-9)
            if allowed.get(task, 0) > cap:
                allowed[task], moved = cap, True
    return allowed


def shape(
    candidates: Sequence[Candidate],
    system_prompt: str,
    count: TokenCounter,
    max_len: int,
    near_threshold: float,
    max_share: Mapping[str, float] | None = None,
) -> ShapedDataset:
    """Candidates -> train and eval records: scrub, fit, exact and near dedup, split, cap each kind's share
    of the training rows (in that order; within a kind the first by content hash stay). The eval split is
    the rows of held-out symbols; nothing else decides it, so a row never moves between splits from one
    day to the next."""
    dropped: list[Dropped] = []
    fitted: list[tuple[Candidate, Record]] = []
    cut_to_fit = 0

    def drop(candidate: Candidate, reason: Any, detail: str = "") -> None:
        dropped.append(
            Dropped(
                task=candidate.task, repo=candidate.repo, path=candidate.path, reason=reason, detail=detail
            )
        )

    for candidate in sorted(candidates, key=Candidate.sort_key):
        unsafe = unsafe_reason(render(candidate, system_prompt))
        if unsafe is not None:
            drop(candidate, *unsafe)
            continue
        record = fit(candidate, system_prompt, count, max_len)
        if record is None:
            drop(candidate, "too_long", f"the answer alone exceeds {max_len} tokens")
            continue
        cut_to_fit += record.messages[1]["content"].endswith(f"{CUT_MARK}\n```")
        fitted.append((candidate, record))

    unique: list[tuple[Candidate, Record]] = []
    seen: set[str] = set()
    for candidate, record in fitted:
        if record.content_hash in seen:
            drop(candidate, "duplicate", record.content_hash)
        else:
            seen.add(record.content_hash)
            unique.append((candidate, record))

    near = near_duplicates([r for _, r in unique], near_threshold)
    for index, earlier in near.items():
        drop(
            unique[index][0], "near_duplicate", f"like {unique[earlier][0].path} ({unique[earlier][0].task})"
        )
    final = sorted(
        (pair for i, pair in enumerate(unique) if i not in near), key=lambda pair: pair[1].content_hash
    )
    train = [(c, r) for c, r in final if not c.held_out]
    allowed = allowed_counts([r.task for _, r in train], max_share or {})
    kept: list[Record] = []
    for candidate, record in train:
        if allowed[record.task] > 0:
            allowed[record.task] -= 1
            kept.append(record)
        else:
            share = (max_share or {})[record.task]
            drop(candidate, "over_share", f"{record.task} may hold at most {share:.0%} of the training rows")
    return ShapedDataset(
        train=kept,
        eval=[r for c, r in final if c.held_out],
        dropped=dropped,
        cut_to_fit=cut_to_fit,
    )


# ---------------------------------------------------------------------------------------------------------
# I/O: the tokenizer and saving
# ---------------------------------------------------------------------------------------------------------


def load_token_counter(model_dir: Path) -> TokenCounter:
    """Token count of a conversation as the trainer will see it: the base model's own chat template.

    The tokenizer loads on the first count, so a day without candidates never pays for it.
    """
    tokenizer: Any = None

    def count(messages: list[dict[str, str]]) -> int:
        nonlocal tokenizer
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        encoded = tokenizer.apply_chat_template(messages, tokenize=True)
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        return len(ids)

    return count


def save_dataset(shaped: ShapedDataset, folder: Path) -> None:
    """`save_to_disk` into `folder` (the caller makes it atomic)."""
    save_records(folder, shaped.train, shaped.eval)


def save_rows(folder: Path, train: Sequence[dict[str, Any]], eval_rows: Sequence[dict[str, Any]]) -> Path:
    """Rows as the window reads them (fixtures, benchmarks), checked against the contract, then saved by the
    one writer."""
    for row in [*train, *eval_rows]:
        check_row(row)
    save_records(
        folder, [Record.model_validate(r) for r in train], [Record.model_validate(r) for r in eval_rows]
    )
    return folder


def save_records(folder: Path, train: Sequence[Record], eval_records: Sequence[Record]) -> None:
    """The fingerprint is set from the content: datasets would otherwise pick a random one and the same rows
    would not give the same bytes."""
    from datasets import Dataset, DatasetDict

    splits = {}
    for name, records in (("train", train), ("eval", eval_records)):
        rows = [r.model_dump(mode="json") for r in records]
        columns = {name: [row[name] for row in rows] for name in ("messages", "task", "content_hash")}
        # from_dict: an empty split keeps its schema
        dataset = Dataset.from_dict(columns, features=features())
        dataset._fingerprint = sha256_bytes(canonical_json(rows))[:16]
        splits[name] = dataset
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = are_progress_bars_disabled()
    disable_progress_bars()  # one bar per split per day is noise in Dagster's logs
    try:
        # One shard per split, even an empty one: datasets writes no file for 0 shards and cannot load that.
        DatasetDict(splits).save_to_disk(str(folder), num_shards=dict.fromkeys(splits, 1))
    finally:
        if not quiet:
            enable_progress_bars()

"""The dataset both lanes agree on: what a row is, and how it is recognised.

Per day D a `datasets.DatasetDict` saved with `save_to_disk` at `<artifacts>/lora_dataset/<YYYY-MM-DD>/`,
splits "train" and "eval"; a row has `messages` (system / user / assistant), `task` (one of TASKS) and
`content_hash` (`content_hash`: sha256 of the canonical messages and task, the only hash a row has). The CPU
lane's accepted results are written in it (writer.py), the trainer reads the window of days (window.py),
and the evaluation asks the "write_body" request word for word (`user_prompt`). Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lanes_pipeline.store import canonical_json, sha256_bytes

DATASET_ASSET = "lora_dataset"
SPLITS = ("train", "eval")
ROLES = {"system", "user", "assistant"}

Task = Literal["explain", "write_tests", "refactor_diff", "write_body", "write_docs", "complete"]
TASKS: tuple[Task, ...] = ("explain", "write_tests", "refactor_diff", "write_body", "write_docs", "complete")
# A "complete" row is no chat: its user message is the raw text an editor sends (`completion_prompt`), its
# assistant message the lines that follow; the trainer trains it as plain text, the loss on those lines.
# `{name}` and `{path}` are the candidate's symbol and file. "write_body" is word for word the request the
# GPU lane's held-out repository tasks send (gpu_lane/repo_tasks.py renders it through user_prompt), so
# what the adapter learns from the user's own functions is the task it is judged on.
INSTRUCTIONS: dict[Task, str] = {
    "explain": "Explain this code: what it does, its public API, its risks and what to test.",
    "write_tests": "Write pytest tests for this code.",
    "refactor_diff": "Propose a small refactor of this code as a unified diff.",
    "write_body": (
        "Write the body of `{name}` in {path}. Reply with the whole function in one ```python block."
    ),
    "write_docs": "Write a docstring with usage examples for `{name}` in {path}.",
}


class DatasetContractError(ValueError):
    """A row or a saved day that does not follow the contract: training on it would train on garbage."""


def check_kinds(kinds: Sequence[str], where: str) -> None:
    """Every name in `kinds` is a task of the contract (a setting keyed by kind, e.g. max_share)."""
    unknown = sorted(set(kinds) - set(TASKS))
    if unknown:
        raise DatasetContractError(f"{where}: unknown kind(s) {unknown}; the kinds are {list(TASKS)}")


class Record(BaseModel):
    model_config = ConfigDict(frozen=True)

    messages: list[dict[str, str]]
    task: Task
    content_hash: str

    def text(self) -> str:
        return "\n".join(m["content"] for m in self.messages)


def content_hash(messages: Sequence[dict[str, str]], task: str) -> str:
    return sha256_bytes(canonical_json({"messages": list(messages), "task": task}))


def user_prompt(task: Task, path: str, code: str, symbol: str | None = None) -> str:
    """The user's request: the task's instruction (naming the symbol when it has one), then the code."""
    instruction = INSTRUCTIONS[task].format(name=symbol or "", path=path)
    return f"{instruction}\n\nFile: {path}\n```python\n{code.rstrip()}\n```"


def make_row(messages: list[dict[str, str]], task: Task = "explain") -> dict[str, Any]:
    """A row as the window reads it, hashed by the contract's one rule."""
    return {"messages": messages, "task": task, "content_hash": content_hash(messages, task)}


def check_row(row: dict[str, Any]) -> None:
    """One row against the contract; a bad row fails loudly rather than training on garbage."""
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DatasetContractError(f"row {row.get('content_hash')!r}: messages must be a non-empty list")
    for message in messages:
        if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise DatasetContractError(f"row {row.get('content_hash')!r}: bad message {message!r}")
    if not any(m["role"] == "assistant" for m in messages):
        raise DatasetContractError(f"row {row.get('content_hash')!r}: no assistant message")
    if row.get("task") not in TASKS:
        raise DatasetContractError(
            f"row {row.get('content_hash')!r}: task {row.get('task')!r} not in {sorted(TASKS)}"
        )


def features() -> Any:
    from datasets import Features, List, Value

    message = {"role": Value("string"), "content": Value("string")}
    return Features({"messages": List(message), "task": Value("string"), "content_hash": Value("string")})


# The code-completion prompt lives in the contract, not beside the evaluation: the training rows continue
# files in exactly this format, so what the adapter learns is what it is judged on.
#
# The prompt stops before the newline that ends the line above the cut, and the continuation begins with it.
# BPE tokenizers merge a newline with the next line's indentation ("\n   " then " if" in SmolLM2's): a prompt
# ending in a bare newline shows the model a token that, in everything it was trained on, comes before a line
# at column 0, so it closed the function instead of continuing it; and a trainer that tokenizes prompt and
# continuation as one text learned tokens the server never showed.
def completion_prompt(path: str, prefix: str, context_chars: int) -> str:
    """What an editor sends for a continuation: a first line `# {path}`, then the file's text before the
    cut (`prefix`, which ends at a line boundary), cut from the left at a line boundary to at most
    `context_chars` characters, so the model always sees whole lines; the newline before the cut is left
    to the model (`at_cut`)."""
    if context_chars < 0:
        raise ValueError(f"completion prompt for {path}: context_chars must be >= 0, got {context_chars}")
    if prefix and not prefix.endswith("\n"):
        raise ValueError(
            f"completion prompt for {path}: the text before the cut must end with a newline (a cut at a "
            f"line boundary), got one ending {prefix[-40:]!r}"
        )
    lines = [f"{line}\n" for line in prefix.split("\n")[:-1]]  # a line boundary is a newline, nothing else
    kept, size = 0, 0
    for line in reversed(lines):
        if size + len(line) > context_chars:
            break
        kept, size = kept + 1, size + len(line)
    return at_cut(f"# {path}\n" + "".join(lines[len(lines) - kept :]))


def at_cut(text: str) -> str:
    """A completion prompt's text (whole lines) without the newline that ends it: that newline, merged with
    the next line's indentation into one token, is the first thing the model writes."""
    return text.removesuffix("\n")


def completion_continuation(lines: str) -> str:
    """What follows a completion prompt: the newline it stops before, then `lines` (whole lines of the
    file) without the newline after the last, which belongs to the line that comes next."""
    return "\n" + lines.removesuffix("\n")

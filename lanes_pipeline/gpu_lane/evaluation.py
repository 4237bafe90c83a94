"""Deciding whether a candidate adapter is promoted: a small coding task score through the served lane, and
the promotion rule over eval losses and task scores. The rule and the checks are pure; `task_score` talks
to the lane through the client it is given."""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.http import ChatMessage, ChatRequest, OpenAIClient


class TaskPrompt(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    prompt: str
    # Each regular expression must match the answer (case-insensitive, multi-line).
    checks: tuple[str, ...]
    max_tokens: int = 64  # enough for a one-function answer; the checks look at the code


# Small, fixed and checkable without running code: a 135M model passes some, a 30B model nearly all; what
# matters is that a candidate does not get worse at them than the base and the adapter it would replace.
TASK_PROMPTS: tuple[TaskPrompt, ...] = (
    TaskPrompt(
        name="square",
        prompt="Write a Python function named square that returns x squared.",
        checks=(r"def\s+square\s*\(", r"return"),
    ),
    TaskPrompt(
        name="is_even",
        prompt="Write a Python function is_even(n) that returns True when n is even.",
        checks=(r"def\s+is_even\s*\(\s*n", r"%\s*2"),
    ),
    TaskPrompt(
        name="reverse",
        prompt="Write a Python function that reverses a string s.",
        checks=(r"def\s+\w+\s*\(", r"\[\s*::\s*-1\s*\]|reversed\("),
    ),
    TaskPrompt(
        name="test",
        prompt="Write a pytest test function for a function add(a, b) that adds two numbers.",
        checks=(r"def\s+test_\w*\s*\(", r"assert"),
    ),
    TaskPrompt(
        name="sum_list",
        prompt="Write a Python function total(items) that returns the sum of a list of numbers.",
        checks=(r"def\s+total\s*\(", r"sum\(|\+="),
    ),
    TaskPrompt(
        name="explain",
        prompt="In one sentence, what does the Python keyword 'yield' do?",
        checks=(r"generat",),
        max_tokens=48,
    ),
)


def passes(answer: str, checks: Sequence[str]) -> bool:
    return all(re.search(check, answer, flags=re.IGNORECASE | re.MULTILINE) for check in checks)


class TaskScore(BaseModel):
    model: str
    score: float = Field(description="fraction of prompts whose answer passes every check")
    passed: list[str]
    failed: list[str]


def task_score(client: OpenAIClient, model: str, prompts: Sequence[TaskPrompt] = TASK_PROMPTS) -> TaskScore:
    """Greedy answers from the served `model` (the base name or an adapter name), checked. The prompts go
    out together: vLLM batches them, which is much faster than one after the other."""

    def one(task: TaskPrompt) -> bool:
        request = ChatRequest(
            model=model,
            messages=[ChatMessage(role="user", content=task.prompt)],
            max_tokens=task.max_tokens,
            temperature=0.0,
        )
        return passes(client.chat(request).text, task.checks)

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    passed = [task.name for task, ok in zip(prompts, results, strict=True) if ok]
    failed = [task.name for task, ok in zip(prompts, results, strict=True) if not ok]
    return TaskScore(model=model, score=round(len(passed) / len(prompts), 4), passed=passed, failed=failed)


class Figures(BaseModel):
    eval_loss: float
    task_score: float


class Decision(BaseModel):
    promote: bool
    reasons: list[str]


def promotion_decision(
    candidate: Figures, base: Figures, current: Figures | None, loss_margin: float, task_tolerance: float
) -> Decision:
    """Promote only if the candidate's eval loss is at least `loss_margin` (a fraction) below both the base
    and the current adapter's, and its task score is no more than `task_tolerance` below either."""
    reasons: list[str] = []
    ok = True
    for label, other in (("base", base), ("current adapter", current)):
        if other is None:
            continue
        limit = other.eval_loss * (1 - loss_margin)
        if candidate.eval_loss <= limit:
            reasons.append(
                f"eval loss {candidate.eval_loss:.4f} <= {limit:.4f} "
                f"({label} {other.eval_loss:.4f} - {loss_margin:.1%})"
            )
        else:
            ok = False
            reasons.append(
                f"eval loss {candidate.eval_loss:.4f} is not {loss_margin:.1%} below "
                f"the {label}'s {other.eval_loss:.4f}"
            )
        floor = other.task_score - task_tolerance
        if candidate.task_score + 1e-9 >= floor:
            reasons.append(f"task score {candidate.task_score:.2f} >= {floor:.2f} ({label})")
        else:
            ok = False
            reasons.append(
                f"task score {candidate.task_score:.2f} is below the {label}'s {other.task_score:.2f}"
            )
    return Decision(promote=ok, reasons=reasons)

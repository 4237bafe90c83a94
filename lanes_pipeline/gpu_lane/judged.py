"""What a judgment rests on: every answer a judged model gave, with its verdict. Pure models.

adapter_evaluation asks the base model, the current adapter and the candidate the same tasks of each task
set and keeps every answer (`answers.json` in the day's evaluation artifact), so a loss can be explained
afterwards: a wrong body, no `def`, an explanation instead of code, an answer cut at max_tokens.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TaskSet = Literal["repo", "anchor", "humaneval", "completion"]
TASK_SETS: tuple[TaskSet, ...] = ("repo", "anchor", "humaneval", "completion")
# The score a pass-fail task set gives each task (1.0 or 0.0).
PASSED = "passed"
EXACT_MATCH, EDIT_SIMILARITY = "exact_match", "edit_similarity"


class Answer(BaseModel):
    """What the served model said to one request."""

    model_config = ConfigDict(frozen=True)

    text: str
    tokens: int = Field(0, description="completion tokens the server counted")
    finish_reason: str | None = Field(None, description="'stop', or 'length': cut at max_tokens")


class TaskAnswer(BaseModel):
    """One model's answer to one task and its verdict."""

    model_config = ConfigDict(frozen=True)

    task: str = Field(description="the task's id, stable across days")
    answer: str
    tokens: int = 0
    finish_reason: str | None = None
    scores: dict[str, float] = Field(
        description="`passed` (1.0 or 0.0) for executed tasks; `exact_match` and `edit_similarity` for "
        "completion points"
    )
    reason: str = Field(description="why it failed (the failing test's message), or what passed")

    @classmethod
    def of(cls, task: str, answer: Answer, scores: dict[str, float], reason: str) -> TaskAnswer:
        return cls(
            task=task,
            answer=answer.text,
            tokens=answer.tokens,
            finish_reason=answer.finish_reason,
            scores=scores,
            reason=reason,
        )


class EvalLoss(BaseModel):
    """One model's eval loss on the held-out rows: overall (per token), by task kind, and per row (by the
    row's content hash: the pairs of a paired test when the eval loss is the primary figure)."""

    loss: float
    by_kind: dict[str, float] = {}
    row_losses: dict[str, float] = {}

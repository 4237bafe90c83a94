"""Executed tasks for judging an adapter: the served model answers a coding task through the lane, the
answer's code runs in the sandbox, and the run decides pass or fail. Shared by the held-out repository
tasks (`repo_tasks.py`) and the HumanEval forgetting guard (`humaneval.py`).

Greedy (temperature 0), one answer per task: the figure is pass@1. The prompt is what a user's editor or
CLI would send through the chat endpoint, in the same chat format the adapter was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.gpu_lane.judged import PASSED, Answer, TaskAnswer
from lanes_pipeline.http import ChatMessage, ChatRequest, OpenAIClient

# A loop: the answer's last 4-40 tokens repeated 5 times in a row. Such an answer runs to max_tokens and
# fails either way; ended here it costs a fifth of the tokens (vLLM's repetition_detection).
LOOP_STOP = {"min_pattern_size": 4, "max_pattern_size": 40, "min_count": 5}


class CodeTask(BaseModel):
    """One task: the chat messages sent, and the name its outcome is reported under."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="stable across days: `HumanEval/3`, `sample:body:textstats.py::words`")
    system: str | None = None
    prompt: str


class TaskOutcome(BaseModel):
    name: str
    passed: bool
    reason: str = Field(description="why it failed (the sandbox's verdict), or what passed")


class PassRate(BaseModel):
    """pass@1 of one served model on a set of tasks, with each outcome (the report lists the failures)."""

    model: str
    passed: int
    total: int
    rate: float = Field(description="passed / total (0 when there were no tasks)")
    outcomes: list[TaskOutcome] = []

    @classmethod
    def of(cls, model: str, outcomes: Sequence[TaskOutcome]) -> PassRate:
        passed = sum(o.passed for o in outcomes)
        rate = round(passed / len(outcomes), 4) if outcomes else 0.0
        return cls(model=model, passed=passed, total=len(outcomes), rate=rate, outcomes=list(outcomes))


def ask(
    client: OpenAIClient, model: str, task: CodeTask, max_tokens: int, stop_loops: bool = False
) -> Answer:
    messages = [ChatMessage(role="system", content=task.system)] if task.system else []
    messages.append(ChatMessage(role="user", content=task.prompt))
    request = ChatRequest(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
        seed=0,
        repetition_detection=LOOP_STOP if stop_loops else None,
    )
    response = client.chat(request)
    finish = response.choices[0].finish_reason if response.choices else None
    return Answer(text=response.text, tokens=response.usage.completion_tokens, finish_reason=finish)


def answers(
    client: OpenAIClient,
    model: str,
    tasks: Sequence[CodeTask],
    max_tokens: int,
    workers: int,
    stop_loops: bool = False,
) -> dict[str, Answer]:
    """task name -> the served model's greedy answer; `workers` requests at once (vLLM batches them)."""
    if not tasks:
        return {}
    with ThreadPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        texts = list(pool.map(lambda t: ask(client, model, t, max_tokens, stop_loops), tasks))
    return {task.name: text for task, text in zip(tasks, texts, strict=True)}


def judged(outcome: TaskOutcome, answer: Answer) -> TaskAnswer:
    """An executed task's record: the answer and its pass-fail verdict."""
    return TaskAnswer.of(outcome.name, answer, {PASSED: 1.0 if outcome.passed else 0.0}, outcome.reason)

"""Prompt layout for the CPU lane: a fixed prefix per task kind, the varying part last.

llama-server reuses the longest common prefix between a new prompt and what a slot processed last, so
every prompt of one task starts with the same bytes (system prompt, output schema, shared context such as
a repo map, the fixed lead of the user turn) and ends with the one part that varies per item. Nothing
that varies (ids, dates, file names) may appear before it.

Adding a task kind: define its output as a pydantic model, then `register(TaskKind(...))`:

    class TestIdeas(BaseModel):
        tests: list[str]

    TEST_IDEAS = register(TaskKind(
        name="test_ideas",
        instructions="Propose unit tests for the Python file below.",
        output_model=TestIdeas,
        lead="File:\\n",
        max_tokens=256,
    ))

    layout = PromptLayout(TEST_IDEAS, shared_context=repo_map)
    requests = [layout.build(path, source) for path, source in files]
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest
from lanes_pipeline.http import ChatMessage
from lanes_pipeline.sandbox.safety import redacted


def json_schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema llama-server turns into a grammar; generated from the pydantic model, never by hand."""
    return model.model_json_schema()


def schema_text(schema: dict[str, Any]) -> str:
    """Stable bytes for a schema inside a prompt: key order must not vary between runs or processes."""
    return json.dumps(schema, sort_keys=True, ensure_ascii=False, separators=(",", ": "))


class TaskKind(BaseModel):
    """One kind of CPU-lane work: what the model is told, what it must answer, and how much it may say."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    instructions: str = Field(min_length=1, description="the fixed system prompt")
    output_model: type[BaseModel] | None = Field(None, description="None: a free-text answer")
    lead: str = Field("", description="fixed text that opens the user turn, before the varying part")
    max_tokens: int = Field(256, ge=1)

    def json_schema(self) -> dict[str, Any] | None:
        return json_schema_of(self.output_model) if self.output_model is not None else None


TASKS: dict[str, TaskKind] = {}


def register(task: TaskKind) -> TaskKind:
    if task.name in TASKS and TASKS[task.name] != task:
        raise ValueError(f"task kind {task.name!r} is already registered differently")
    TASKS[task.name] = task
    return task


def task_kind(name: str) -> TaskKind:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task kind {name!r}; known: {', '.join(sorted(TASKS)) or 'none'}") from None


class PromptLayout:
    """Builds every request of one task (and one shared context) with byte-identical prefixes.

    Layout: system = instructions, then the output schema, then the shared context; user = lead, then the
    varying part. The request records where the varying part starts (`varying_from`), which is also the
    only part the context-fit rule may shrink.

    The shared context and the varying part are repository text: the secret values in them are redacted
    (`redact_secrets`) here, the one place every CPU-lane prompt passes. A file with a key of a known shape
    never gets this far (the snapshot leaves it out); what is left is random-looking values (hashes, test
    vectors), which a model never needs verbatim. The sandbox runs the repository's real bytes.
    """

    def __init__(self, task: TaskKind, shared_context: str = "") -> None:
        self.task = task
        self.shared_context = shared_context

    @cached_property
    def system_prompt(self) -> str:
        parts = [self.task.instructions.strip()]
        schema = self.task.json_schema()
        if schema is not None:
            # The grammar already forces the shape; saying it in words helps a small model fill it well.
            parts.append("Answer with one JSON object that matches this JSON schema:\n" + schema_text(schema))
        if self.shared_context:
            parts.append("Context:\n" + redacted(self.shared_context.strip()))
        return "\n\n".join(parts)

    @cached_property
    def prefix_messages(self) -> tuple[ChatMessage, ...]:
        return (ChatMessage(role="system", content=self.system_prompt),)

    def build(self, item_id: str, varying: str, max_tokens: int | None = None) -> BatchRequest:
        return BatchRequest(
            id=item_id,
            messages=[
                *self.prefix_messages,
                ChatMessage(role="user", content=self.task.lead + redacted(varying)),
            ],
            max_tokens=max_tokens or self.task.max_tokens,
            json_schema=self.task.json_schema(),
            output_model=self.task.output_model,
            varying_from=len(self.task.lead),
        )


class ShortAnswer(BaseModel):
    """A one-field structured answer: the smallest schema task, used by `lanes cpu ask --json` and tests."""

    answer: str = Field(description="the answer, as short as possible")


ASK = register(
    TaskKind(
        name="ask",
        instructions="You are a careful assistant. Answer the question in the user turn briefly.",
        lead="Question: ",
        max_tokens=256,
    )
)
SHORT_ANSWER = register(
    TaskKind(
        name="short_answer",
        instructions="You are a careful assistant. Answer the question in the user turn briefly.",
        output_model=ShortAnswer,
        lead="Question: ",
        max_tokens=64,
    )
)

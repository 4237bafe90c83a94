"""The CPU lane's batch, as data: what a caller asks (BatchRequest, BatchConfig) and what it gets back per
item (ItemResult, with RequestMetrics or an ItemFailure). Pure: no I/O."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.config.models import CpuLane
from lanes_pipeline.cpu_lane.batching.client import Overflow
from lanes_pipeline.cpu_lane.batching.grammar import grammar_for
from lanes_pipeline.http import ChatMessage, ChatRequest, ChatResponse, Timings, Usage


def response_format_for(schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's json_schema response format; llama-server turns `schema` into a grammar."""
    return {"type": "json_schema", "json_schema": {"name": "output", "strict": True, "schema": schema}}


class BatchRequest(BaseModel):
    """One item of a batch: a chat request plus what the runner needs to fit, parse and cache it."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    id: str = Field(min_length=1, description="the caller's name for the item, used in errors and results")
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0)
    seed: int | None = 0
    stop: list[str] | None = None
    # Generate past end-of-text, to a stop string or max_tokens: an answer of a known length (drills, load).
    ignore_eos: bool = False
    json_schema: dict[str, Any] | None = None
    # Validates the parsed answer beyond what the schema's grammar enforces; not part of the cache key.
    output_model: type[BaseModel] | None = Field(None, exclude=True)
    # Where the varying part starts in the last message (chars); only that part may be shrunk to fit.
    varying_from: int | None = Field(None, ge=0)

    def chat_request(
        self, model: str, messages: list[ChatMessage] | None = None, max_tokens: int | None = None
    ) -> ChatRequest:
        budget = max_tokens or self.max_tokens
        # A task's own model gets a grammar bounded to fit the budget (grammar.py says why); a bare schema
        # (`lanes cpu batch` lines), or a budget too small for any bounded answer, goes as response_format.
        grammar = None
        if self.json_schema is not None and self.output_model is not None:
            with suppress(ValueError):
                grammar = grammar_for(self.output_model, budget)
        return ChatRequest(
            model=model,
            messages=messages if messages is not None else self.messages,
            max_tokens=budget,
            temperature=self.temperature,
            seed=self.seed,
            stop=self.stop,
            ignore_eos=self.ignore_eos or None,
            response_format=response_format_for(self.json_schema)
            if self.json_schema is not None and grammar is None
            else None,
            grammar=grammar,
        )


class RequestMetrics(BaseModel):
    """Figures of one answered request, stored with the response in the cache."""

    prompt_tokens: int
    cached_prompt_tokens: int | None  # prompt tokens reused from the slot's prefix cache
    completion_tokens: int
    prompt_tokens_per_s: float | None  # the server's own timing, when it reports one
    generation_tokens_per_s: float | None
    latency_s: float  # wall clock around the HTTP request
    truncated: bool  # hit max_tokens (ik says finish_reason "stop" even then)
    finish_reason: str | None = None


def cached_prompt_tokens(usage: Usage, timings: Timings | None) -> int | None:
    """usage.prompt_tokens_details.cached_tokens, else prompt_tokens - timings.prompt_n (both servers)."""
    details = usage.prompt_tokens_details
    if details is not None and details.cached_tokens is not None:
        return details.cached_tokens
    if timings is not None and timings.prompt_n is not None:
        return max(0, usage.prompt_tokens - timings.prompt_n)
    return None


def request_metrics(response: ChatResponse, latency_s: float, max_tokens: int) -> RequestMetrics:
    usage, timings = response.usage, response.timings
    finish = response.choices[0].finish_reason if response.choices else None
    return RequestMetrics(
        prompt_tokens=usage.prompt_tokens,
        cached_prompt_tokens=cached_prompt_tokens(usage, timings),
        completion_tokens=usage.completion_tokens,
        prompt_tokens_per_s=timings.prompt_per_second if timings else None,
        generation_tokens_per_s=timings.predicted_per_second if timings else None,
        latency_s=round(latency_s, 4),
        truncated=usage.completion_tokens >= max_tokens or finish == "length",
        finish_reason=finish,
    )


FailureKind = Literal["unreachable", "server_error", "http_error", "empty", "too_long", "unparseable"]
# Failures the same request would meet again, which the assets remember rather than ask each run: a prompt
# too long stays too long, an answer that did not parse after its repair, and "empty" (end-of-text on every
# try: ik_llama.cpp does so for some prompts at temperature 0, whatever its cache holds; asked again each
# run, a re-run of a day would never be free). The others (server down, timeouts) are asked again.
DETERMINISTIC_FAILURES: frozenset[str] = frozenset({"unparseable", "too_long", "empty"})


def names_deterministic_failure(reason: str) -> bool:
    """Whether a failure reason written as "<kind>: ..." names one of DETERMINISTIC_FAILURES."""
    return reason.split(":", 1)[0] in DETERMINISTIC_FAILURES


class ItemFailure(BaseModel):
    kind: FailureKind
    reason: str


class ItemResult(BaseModel):
    """The outcome of one item, at its input position."""

    index: int
    id: str
    key: str
    status: Literal["ok", "failed"]
    from_cache: bool = False
    text: str | None = None
    parsed: Any = None
    metrics: RequestMetrics | None = None
    requests_sent: int = 0  # completion requests this run sent for the item (retries and repair included)
    discarded_answers: int = 0  # answers given and thrown away in this run (empty; unparseable, repaired)
    discarded_completion_tokens: int = 0  # the tokens the server generated for those
    repaired: bool = False
    shrunk: bool = False
    failure: ItemFailure | None = None
    endpoint: str | None = None  # the server that answered it in this run (several endpoints: which one)
    # Every prompt the server evaluated for it in this run, as token ids, the kept answer's last (a prompt
    # asked again after an empty answer, a repair after the first): what a perfect prefix cache could have
    # served (prefix_order.cacheable_prompt_tokens). None when the server cannot render prompts. Memory only.
    sent_prompts: list[tuple[int, ...]] | None = Field(default=None, exclude=True, repr=False)
    # Its place in the order the batch sent its items (SendOrder's, not the input's): the reuse limit's order.
    sent_order: int | None = Field(default=None, exclude=True, repr=False)


class BatchConfig(BaseModel):
    """How a batch behaves; the resource fills it from configs/lanes.yaml. Request retries are the client's
    (`CpuClient(retry=...)`, the lane's RetryPolicy); the runner retries only an empty answer, as often."""

    model_alias: str
    configured_model: str
    max_slots: int = Field(ge=1)
    overflow: Overflow
    ready_timeout_s: float = Field(gt=0)
    lease_dir: Path | None = None

    @classmethod
    def of(cls, lane: CpuLane, **changes: Any) -> BatchConfig:
        """The lane's settings (its defaults live in CpuLane, nowhere else), with `changes` on top."""
        return cls(
            model_alias=lane.model_alias,
            configured_model=lane.model,
            max_slots=lane.max_slots,
            overflow=lane.overflow,
            ready_timeout_s=lane.ready_timeout_s,
        ).model_copy(update=changes)

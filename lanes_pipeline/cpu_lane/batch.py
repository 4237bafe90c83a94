"""The CPU lane's batch runner: many requests, slot-bounded, cached, retried, resumable, measured.

The first half of this module is pure (request and result models, JSON parsing and the repair prompt,
backoff, per-request metrics, the batch summary) and tests without a server. The second half does I/O:
`SlotGate` bounds in-flight requests, `BatchRunner` runs a batch against a `CpuClient` and a
`ResponseCache`.

A batch, step by step: wait for the server (bounded), read its slots, context and weights fingerprint once;
answer every request already in the cache without sending anything; send the rest with at most `slots`
completion requests in flight, each committed to the cache the moment it is good. A request that still
fails after bounded retries is recorded with its reason and does not sink the batch.
"""

from __future__ import annotations

import fcntl
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lanes_pipeline.cpu_lane.answer_cache import CacheEntry, FailureRecord, ResponseCache, cache_key
from lanes_pipeline.cpu_lane.bandwidth import YieldReport
from lanes_pipeline.cpu_lane.client import (
    CpuClient,
    FittedPrompt,
    LaneAuthError,
    LaneHTTPError,
    Overflow,
    PromptTooLongError,
    ServerInfo,
)
from lanes_pipeline.errors import LaneUnreachableError
from lanes_pipeline.http import ChatMessage, ChatRequest, ChatResponse, Timings, Usage

# ---------------------------------------------------------------------------------------------------------
# Requests and results
# ---------------------------------------------------------------------------------------------------------


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
    json_schema: dict[str, Any] | None = None
    # Validates the parsed answer beyond what the schema's grammar enforces; not part of the cache key.
    output_model: type[BaseModel] | None = Field(None, exclude=True)
    # Where the varying part starts in the last message (chars); only that part may be shrunk to fit.
    varying_from: int | None = Field(None, ge=0)

    def chat_request(
        self, model: str, messages: list[ChatMessage] | None = None, max_tokens: int | None = None
    ) -> ChatRequest:
        return ChatRequest(
            model=model,
            messages=messages if messages is not None else self.messages,
            max_tokens=max_tokens or self.max_tokens,
            temperature=self.temperature,
            seed=self.seed,
            stop=self.stop,
            response_format=response_format_for(self.json_schema) if self.json_schema is not None else None,
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
    repaired: bool = False
    shrunk: bool = False
    failure: ItemFailure | None = None


# ---------------------------------------------------------------------------------------------------------
# Parsing and repair (pure)
# ---------------------------------------------------------------------------------------------------------


class ParseOutcome(BaseModel):
    ok: bool
    value: Any = None
    error: str = ""


def extract_json(text: str) -> Any:
    """The JSON value in an answer: tolerates code fences and prose around one object or array."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0].strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as first_error:
        decoder = json.JSONDecoder()
        for start, char in enumerate(stripped):
            if char in "{[":
                try:
                    return decoder.raw_decode(stripped, start)[0]
                except json.JSONDecodeError:
                    continue
        raise first_error


def parse_structured(text: str, output_model: type[BaseModel] | None) -> ParseOutcome:
    """Parse an answer that should match a schema; never raises, says why it failed."""
    if not text.strip():
        return ParseOutcome(ok=False, error="empty answer")
    try:
        value = extract_json(text)
    except json.JSONDecodeError as exc:
        return ParseOutcome(ok=False, error=f"not valid JSON: {exc.msg} at char {exc.pos}")
    if output_model is None:
        return ParseOutcome(ok=True, value=value)
    try:
        return ParseOutcome(ok=True, value=output_model.model_validate(value).model_dump(mode="json"))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors())
        return ParseOutcome(ok=False, error=f"does not match the schema: {problems}")


REPAIR_PROMPT = (
    "Your previous reply could not be used: {error}. Reply again with only one JSON object that matches "
    "the schema, and nothing else."
)


def repair_request(request: BatchRequest, bad_text: str, error: str, truncated: bool) -> BatchRequest:
    """The one repair attempt: the original conversation (its prefix stays cached), the bad answer, and
    what was wrong; twice the token budget when the first answer ran out of tokens."""
    messages = [
        *request.messages,
        ChatMessage(role="assistant", content=bad_text),
        ChatMessage(role="user", content=REPAIR_PROMPT.format(error=error)),
    ]
    max_tokens = request.max_tokens * 2 if truncated else request.max_tokens
    return request.model_copy(update={"messages": messages, "max_tokens": max_tokens, "varying_from": None})


def backoff_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with jitter before retry number `attempt` (1-based): a random point in the
    upper half of min(cap, base * 2^(attempt-1)), so retries of many items spread out but still wait."""
    ceiling = min(cap_s, base_s * 2 ** (attempt - 1))
    return ceiling / 2 + rng.random() * ceiling / 2


# ---------------------------------------------------------------------------------------------------------
# Summary (pure)
# ---------------------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class BatchSummary(BaseModel):
    """One batch in figures, for Dagster metadata and the CLI. Throughputs are over the batch's wall time;
    latencies and token figures cover the items answered by the server in this run (not cache hits)."""

    items: int
    ok: int
    failed: int
    cache_hits: int
    answered: int  # items the server answered in this run
    requests_sent: int  # completion requests, retries and repairs included
    failure_ratio: float
    failures_by_kind: dict[str, int]
    wall_s: float
    latency_p50_s: float | None
    latency_p95_s: float | None
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    prompt_tokens_per_s: float  # prompt tokens the server evaluated (cache reuse excluded) per second
    generation_tokens_per_s: float
    prefix_cache_reuse: float | None  # cached prompt tokens / prompt tokens

    def metadata(self) -> dict[str, float | int]:
        """Flat numbers, which Dagster plots over time."""
        return {k: v for k, v in self.model_dump().items() if isinstance(v, int | float) and v is not None}


def summarize(results: Sequence[ItemResult], wall_s: float) -> BatchSummary:
    answered = [r for r in results if r.status == "ok" and not r.from_cache and r.metrics is not None]
    metrics = [r.metrics for r in answered if r.metrics is not None]
    prompt = sum(m.prompt_tokens for m in metrics)
    cached = sum(m.cached_prompt_tokens or 0 for m in metrics)
    completion = sum(m.completion_tokens for m in metrics)
    failed = [r for r in results if r.status == "failed"]
    latencies = [m.latency_s for m in metrics]
    return BatchSummary(
        items=len(results),
        ok=sum(r.status == "ok" for r in results),
        failed=len(failed),
        cache_hits=sum(r.from_cache for r in results),
        answered=len(answered),
        requests_sent=sum(r.requests_sent for r in results),
        failure_ratio=len(failed) / len(results) if results else 0.0,
        failures_by_kind=dict(Counter(r.failure.kind for r in failed if r.failure)),
        wall_s=round(wall_s, 3),
        latency_p50_s=percentile(latencies, 50),
        latency_p95_s=percentile(latencies, 95),
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        completion_tokens=completion,
        prompt_tokens_per_s=(prompt - cached) / wall_s if wall_s > 0 else 0.0,
        generation_tokens_per_s=completion / wall_s if wall_s > 0 else 0.0,
        prefix_cache_reuse=cached / prompt if prompt else None,
    )


@dataclass(frozen=True)
class BatchProgress:
    total: int
    done: int
    cache_hits: int
    failed: int
    elapsed_s: float
    answered: int  # done by the server in this run: the rate the ETA is based on

    @property
    def eta_s(self) -> float | None:
        remaining = self.total - self.done
        if remaining == 0:
            return 0.0
        if self.answered == 0 or self.elapsed_s <= 0:
            return None
        return remaining * self.elapsed_s / self.answered

    def line(self) -> str:
        eta = "unknown" if self.eta_s is None else f"{self.eta_s:.0f} s"
        percent = 100 * self.done / self.total if self.total else 100.0
        return (
            f"{self.done}/{self.total} done ({percent:.0f}%): {self.cache_hits} from cache, "
            f"{self.failed} failed; {self.elapsed_s:.0f} s elapsed, ETA {eta}"
        )


ProgressCallback = Callable[[BatchProgress], None]
_T = TypeVar("_T")


class BatchResult(BaseModel):
    results: list[ItemResult]
    summary: BatchSummary
    server: ServerInfo
    bandwidth: YieldReport | None = None  # what yielding to the GPU lane cost, when it was watched

    def failed(self) -> list[ItemResult]:
        return [r for r in self.results if r.status == "failed"]


# ---------------------------------------------------------------------------------------------------------
# I/O: slot bound and runner
# ---------------------------------------------------------------------------------------------------------


class SlotGate:
    """At most `limit` completion requests in flight: across this process's threads (a semaphore) and,
    with `lease_dir`, across processes (one lock file per slot: a CLI batch beside a Dagster run shares
    the slots instead of doubling them). flock leases die with their process, so a crash frees them.

    `cap`, when given, is asked before each admission and may lower the bound for a while (the bandwidth
    governor's minimum while the GPU lane is busy; None means no cap): requests in flight finish, new ones
    wait until fewer than the cap are in flight."""

    def __init__(
        self,
        limit: int,
        lease_dir: Path | None = None,
        poll_s: float = 0.05,
        cap: Callable[[], int | None] | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("a slot gate needs at least one slot")
        self.limit, self.lease_dir, self.poll_s, self.cap = limit, lease_dir, poll_s, cap
        self._semaphore = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._admitted = 0
        self.in_flight = 0
        self.max_in_flight = 0
        if lease_dir is not None:
            lease_dir.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def _admission(self) -> Iterator[None]:
        """Wait until the cap (if any) leaves room; counted before the lease, so a waiting thread holds no
        cross-process slot."""
        while True:
            cap = self.cap() if self.cap is not None else None
            with self._lock:  # the check and the count under one lock: two threads cannot both slip in
                if cap is None or self._admitted < max(1, cap):
                    self._admitted += 1
                    break
            time.sleep(self.poll_s)
        try:
            yield
        finally:
            with self._lock:
                self._admitted -= 1

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._semaphore, self._admission():
            lease = self._lease() if self.lease_dir is not None else None
            with self._lock:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                yield
            finally:
                with self._lock:
                    self.in_flight -= 1
                if lease is not None:
                    fcntl.flock(lease, fcntl.LOCK_UN)
                    lease.close()

    def _lease(self) -> IO[str]:
        assert self.lease_dir is not None
        while True:
            for slot in range(self.limit):
                handle = (self.lease_dir / f"slot-{slot}.lock").open("a")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return handle
                except BlockingIOError:
                    handle.close()
            time.sleep(self.poll_s)  # another process holds every slot


class BatchConfig(BaseModel):
    """How a batch behaves; the resource fills it from configs/lanes.yaml."""

    model_alias: str
    configured_model: str
    max_slots: int = Field(2, ge=1)
    overflow: Overflow = "error"
    max_attempts: int = Field(4, ge=1, description="tries per request: 1 + retries")
    backoff_base_s: float = Field(1.0, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    ready_timeout_s: float = Field(600.0, gt=0)
    lease_dir: Path | None = None


class _EmptyAnswer(Exception):
    pass


class _ItemFailed(Exception):
    def __init__(self, kind: FailureKind, reason: str, sent: int) -> None:
        self.kind, self.reason, self.sent = kind, reason, sent
        super().__init__(reason)


@dataclass
class _Answer:
    response: ChatResponse
    metrics: RequestMetrics
    sent: int  # requests it took, retries included


class BatchRunner:
    def __init__(
        self,
        client: CpuClient,
        cache: ResponseCache,
        config: BatchConfig,
        seed: int | None = None,
        cap: Callable[[], int | None] | None = None,
    ) -> None:
        """`cap`: see SlotGate (the bandwidth governor's cap on in-flight requests)."""
        self.client, self.cache, self.config, self.cap = client, cache, config, cap
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.gate: SlotGate | None = None

    def prepare(self) -> ServerInfo:
        self.client.wait_ready(self.config.ready_timeout_s)
        return self.client.server_info(self.config.configured_model)

    def run(self, requests: Sequence[BatchRequest], progress: ProgressCallback | None = None) -> BatchResult:
        started = time.monotonic()
        info = self.prepare()
        limit = max(1, min(self.config.max_slots, info.total_slots))
        lease_dir = self.config.lease_dir / _url_slug(info.url) if self.config.lease_dir else None
        self.gate = SlotGate(limit, lease_dir, cap=self.cap)

        keys = [cache_key(r.chat_request(self.config.model_alias), info.fingerprint) for r in requests]
        entries = self.cache.get_many(keys)
        results: list[ItemResult | None] = [None] * len(requests)
        pending: list[int] = []
        for index, (request, key) in enumerate(zip(requests, keys, strict=True)):
            entry = entries.get(key)
            if entry is not None and self._usable(entry, request, info):
                results[index] = _from_cache(index, request, entry)
            else:
                pending.append(index)

        counts = Counter(hits=len(requests) - len(pending))

        def report() -> None:
            if progress is not None:
                done = counts["hits"] + counts["answered"] + counts["failed"]
                progress(
                    BatchProgress(
                        len(requests),
                        done,
                        counts["hits"],
                        counts["failed"],
                        time.monotonic() - started,
                        counts["answered"],
                    )
                )

        report()
        # Twice the slots in threads: token counting for the next item overlaps generation; the gate keeps
        # completion requests at `limit`.
        with ThreadPoolExecutor(max_workers=2 * limit, thread_name_prefix="cpu-lane") as pool:
            futures: dict[Future[ItemResult], int] = {
                pool.submit(self._run_item, i, requests[i], keys[i], info): i for i in pending
            }
            try:
                remaining = set(futures)
                while remaining:
                    finished, remaining = wait(remaining, return_when=FIRST_COMPLETED)
                    for future in finished:
                        result = future.result()  # only LaneAuthError and bugs get here: they end the batch
                        results[result.index] = result
                        counts["failed" if result.status == "failed" else "answered"] += 1
                        report()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        final = [r for r in results if r is not None]
        return BatchResult(results=final, summary=summarize(final, time.monotonic() - started), server=info)

    def _usable(self, entry: CacheEntry, request: BatchRequest, info: ServerInfo) -> bool:
        if entry.shrunk_for_ctx is not None and (
            self.config.overflow != "shrink" or entry.shrunk_for_ctx != info.per_slot_ctx
        ):
            return False
        if request.output_model is not None:
            try:
                request.output_model.model_validate(entry.parsed)
            except ValidationError:
                return False  # the model's validators changed since: ask again
        return True

    def _run_item(self, index: int, request: BatchRequest, key: str, info: ServerInfo) -> ItemResult:
        sent = 0
        try:
            fitted = self._fit(
                request.id,
                request.messages,
                request.varying_from,
                request.max_tokens,
                info,
                self.config.overflow,
            )
            answer = self._send(request.chat_request(self.config.model_alias, fitted.messages), request.id)
            sent += answer.sent
            text, parsed, repaired = answer.response.text, None, False
            if request.json_schema is not None:
                outcome = parse_structured(text, request.output_model)
                if not outcome.ok:
                    answer, outcome = self._repair(request, fitted.messages, answer, outcome.error, info)
                    sent += answer.sent
                    repaired = True
                text, parsed = answer.response.text, outcome.value
        except PromptTooLongError as exc:
            return self._failed(index, request, key, info, _ItemFailed("too_long", str(exc), sent))
        except _ItemFailed as exc:
            exc.sent += sent
            return self._failed(index, request, key, info, exc)
        entry = CacheEntry(
            key=key,
            fingerprint=info.fingerprint,
            item_id=request.id,
            text=text,
            parsed=parsed,
            metrics=answer.metrics.model_dump(),
            shrunk_for_ctx=info.per_slot_ctx if fitted.shrunk else None,
            attempts=sent,
            repaired=repaired,
        )
        self.cache.put(entry)  # committed before the item counts as done: a kill after this loses nothing
        return ItemResult(
            index=index,
            id=request.id,
            key=key,
            status="ok",
            text=text,
            parsed=parsed,
            metrics=answer.metrics,
            requests_sent=sent,
            repaired=repaired,
            shrunk=fitted.shrunk,
        )

    def _repair(
        self,
        request: BatchRequest,
        sent_messages: list[ChatMessage],
        first: _Answer,
        error: str,
        info: ServerInfo,
    ) -> tuple[_Answer, ParseOutcome]:
        """One repair attempt; still unparseable afterwards -> the item fails as 'unparseable'."""
        fixed = repair_request(
            request.model_copy(update={"messages": sent_messages}),
            first.response.text,
            error,
            first.metrics.truncated,
        )
        try:
            fitted = self._fit(request.id, fixed.messages, None, fixed.max_tokens, info, "error")
        except PromptTooLongError:
            raise _ItemFailed(
                "unparseable", f"{error} (no room left in the context for a repair)", 0
            ) from None
        answer = self._send(fixed.chat_request(self.config.model_alias, fitted.messages), request.id)
        outcome = parse_structured(answer.response.text, request.output_model)
        if not outcome.ok:
            raise _ItemFailed("unparseable", f"{error}; after one repair: {outcome.error}", answer.sent)
        return answer, outcome

    def _fit(
        self,
        item: str,
        messages: list[ChatMessage],
        varying_from: int | None,
        max_tokens: int,
        info: ServerInfo,
        overflow: Overflow,
    ) -> FittedPrompt:
        """Count tokens (and shrink) with the same retries as a request: a server that dies between two
        requests fails the item, not the batch."""

        def count() -> FittedPrompt:
            return self.client.fit_prompt(item, messages, varying_from, max_tokens, info, overflow)

        return self._retrying(item, count, sends_completion=False)[0]

    def _send(self, chat: ChatRequest, item: str) -> _Answer:
        """One completion request, retried like any other; an empty answer is retried too (seen on
        ik_llama.cpp: the first answer after start can be empty, and asking again helps)."""
        assert self.gate is not None
        gate = self.gate

        def ask() -> tuple[ChatResponse, float]:
            with gate.hold():
                started = time.perf_counter()
                response = self.client.chat(chat)
                latency = time.perf_counter() - started
            if not response.text.strip():
                raise _EmptyAnswer
            return response, latency

        (response, latency), attempts = self._retrying(item, ask, sends_completion=True)
        return _Answer(response, request_metrics(response, latency, chat.max_tokens), attempts)

    def _retrying(self, item: str, action: Callable[[], _T], sends_completion: bool) -> tuple[_T, int]:
        """`action` with bounded retries: connection errors, timeouts, 5xx and empty answers are retried
        with exponential backoff and jitter; 4xx is not (the same request would fail the same way), and a
        refused API key ends the whole batch. Returns the value and the number of attempts."""
        last: tuple[FailureKind, str] = ("unreachable", "not sent")
        for attempt in range(1, self.config.max_attempts + 1):
            if attempt > 1:
                with self._rng_lock:
                    delay = backoff_delay(
                        attempt - 1, self.config.backoff_base_s, self.config.backoff_max_s, self._rng
                    )
                time.sleep(delay)
            try:
                return action(), attempt
            except LaneAuthError:
                raise
            except LaneHTTPError as exc:
                if not exc.retryable:
                    raise _ItemFailed("http_error", str(exc), attempt if sends_completion else 0) from None
                last = ("server_error", str(exc))
            except LaneUnreachableError as exc:
                last = ("unreachable", str(exc))
            except _EmptyAnswer:
                last = ("empty", "the server answered with empty content")
        kind, reason = last
        sent = self.config.max_attempts if sends_completion else 0
        raise _ItemFailed(kind, f"item {item!r}: {reason} (after {self.config.max_attempts} attempts)", sent)

    def _failed(
        self, index: int, request: BatchRequest, key: str, info: ServerInfo, failure: _ItemFailed
    ) -> ItemResult:
        record = FailureRecord(
            key=key,
            fingerprint=info.fingerprint,
            item_id=request.id,
            kind=failure.kind,
            reason=failure.reason,
            attempts=failure.sent,
            failed_at=time.time(),
        )
        self.cache.record_failure(record)
        return ItemResult(
            index=index,
            id=request.id,
            key=key,
            status="failed",
            requests_sent=failure.sent,
            failure=ItemFailure(kind=failure.kind, reason=failure.reason),
        )


def _from_cache(index: int, request: BatchRequest, entry: CacheEntry) -> ItemResult:
    return ItemResult(
        index=index,
        id=request.id,
        key=entry.key,
        status="ok",
        from_cache=True,
        text=entry.text,
        parsed=entry.parsed,
        metrics=RequestMetrics.model_validate(entry.metrics),
        repaired=entry.repaired,
        shrunk=entry.shrunk_for_ctx is not None,
    )


def _url_slug(url: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in url.removeprefix("http://").removeprefix("https://"))

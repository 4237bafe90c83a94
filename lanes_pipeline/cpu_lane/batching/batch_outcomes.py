"""How one item of a CPU-lane batch ends, as the batch runner (`batch.py`) passes it between its workers:
an answer with what it cost, a failure with its kind, a return to the queue when its endpoint went down,
or a stop; and an item answered from the cache."""

from __future__ import annotations

import time
from dataclasses import dataclass

from lanes_pipeline.cpu_lane.batching.answer_cache import CacheEntry, FailureRecord, ResponseCache
from lanes_pipeline.cpu_lane.batching.batch_models import (
    BatchRequest,
    FailureKind,
    ItemFailure,
    ItemResult,
    RequestMetrics,
)
from lanes_pipeline.cpu_lane.batching.client import ServerInfo
from lanes_pipeline.errors import LaneStatusError, LaneUnreachableError
from lanes_pipeline.http import ChatResponse
from lanes_pipeline.sandbox.safety import redacted


class Stopped(Exception):
    """Raised in a worker whose batch ended early (nobody reads it: the batch has already raised)."""


class Requeue(Exception):
    """The item's endpoint went down: the item goes back to the queue for the others."""

    def __init__(self, sent: int) -> None:
        self.sent = sent


@dataclass(frozen=True)
class Requeued:
    index: int
    sent: int  # completion requests it took on the endpoint that went down


class ItemFailed(Exception):
    def __init__(self, kind: FailureKind, reason: str, sent: int) -> None:
        self.kind, self.reason, self.sent = kind, reason, sent
        super().__init__(reason)


@dataclass
class Answer:
    response: ChatResponse
    metrics: RequestMetrics
    sent: int  # completion requests it took, the client's retries and empty answers included
    # Answers thrown away (empty; unparseable, then repaired) and their tokens, which the server counted.
    discarded: int = 0
    discarded_tokens: int = 0
    # Each prompt the server evaluated for it (token ids; None when unknown), the kept answer's last.
    prompts: list[tuple[int, ...]] | None = None


# An empty answer of a sampled request is asked again with its seed moved by this much per try.
EMPTY_RESEED_STEP = 1_000_003


def failure_kind(error: LaneStatusError | LaneUnreachableError) -> FailureKind:
    if isinstance(error, LaneUnreachableError):
        return "unreachable"
    return "server_error" if error.retryable else "http_error"


def from_cache(index: int, request: BatchRequest, entry: CacheEntry) -> ItemResult:
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


def failed(
    cache: ResponseCache, index: int, request: BatchRequest, key: str, info: ServerInfo, failure: ItemFailed
) -> ItemResult:
    """The item's failure, recorded in the cache (so the assets remember it) and as its result."""
    # A parse error quotes the answer (pydantic's `input_value=...`): its secret values are redacted before
    # the reason reaches the cache, the assets' reasons and the logs.
    reason = redacted(failure.reason)
    record = FailureRecord(
        key=key,
        fingerprint=info.fingerprint,
        item_id=request.id,
        kind=failure.kind,
        reason=reason,
        attempts=failure.sent,
        failed_at=time.time(),
    )
    cache.record_failure(record)
    return ItemResult(
        index=index,
        id=request.id,
        key=key,
        status="failed",
        requests_sent=failure.sent,
        failure=ItemFailure(kind=failure.kind, reason=reason),
    )

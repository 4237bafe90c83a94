"""A batch in figures: the summary for Dagster metadata and the CLI, and the progress line. Pure."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from lanes_pipeline.cpu_lane.batching.batch_models import ItemResult
from lanes_pipeline.cpu_lane.batching.prefix_order import cacheable_prompt_tokens


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
    completion_tokens: int  # of the answers kept
    # Answers the server gave that the runner threw away (empty: asked again; unparseable: repaired), and
    # their tokens: completion_tokens + discarded_completion_tokens is what the server generated.
    discarded_answers: int
    discarded_completion_tokens: int
    prompt_tokens_per_s: float  # prompt tokens the server evaluated (cache reuse excluded) per second
    generation_tokens_per_s: float
    prefix_cache_reuse: float | None  # cached prompt tokens / prompt tokens
    # What a perfect prefix cache could have served of the same prompts (each one's longest common prefix
    # with any prompt evaluated before it in this batch), and that over prompt tokens: the layout's limit,
    # beside which prefix_cache_reuse is judged. None when the server cannot render prompts.
    cacheable_prompt_tokens: int | None = None
    prefix_reuse_limit: float | None = None
    # Slots a group's shared prefix was copied into from the slot that evaluated it (slot_copy.py).
    prefix_slot_copies: int = 0

    def metadata(self) -> dict[str, float | int]:
        """Flat numbers, which Dagster plots over time."""
        return {k: v for k, v in self.model_dump().items() if isinstance(v, int | float) and v is not None}


def summarize(results: Sequence[ItemResult], wall_s: float, prefix_slot_copies: int = 0) -> BatchSummary:
    answered = [r for r in results if r.status == "ok" and not r.from_cache and r.metrics is not None]
    metrics = [r.metrics for r in answered if r.metrics is not None]
    prompt = sum(m.prompt_tokens for m in metrics)
    cached = sum(m.cached_prompt_tokens or 0 for m in metrics)
    completion = sum(m.completion_tokens for m in metrics)
    failed = [r for r in results if r.status == "failed"]
    latencies = [m.latency_s for m in metrics]
    cacheable = _cacheable(answered) if answered else None
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
        discarded_answers=sum(r.discarded_answers for r in answered),
        discarded_completion_tokens=sum(r.discarded_completion_tokens for r in answered),
        prompt_tokens_per_s=(prompt - cached) / wall_s if wall_s > 0 else 0.0,
        generation_tokens_per_s=completion / wall_s if wall_s > 0 else 0.0,
        prefix_cache_reuse=cached / prompt if prompt else None,
        cacheable_prompt_tokens=cacheable,
        prefix_reuse_limit=cacheable / prompt if prompt and cacheable is not None else None,
        prefix_slot_copies=prefix_slot_copies,
    )


def _cacheable(answered: Sequence[ItemResult]) -> int | None:
    """Tokens of the kept answers' prompts a perfect prefix cache could serve, in the order the batch sent
    them (`sent_order`; input order where it is unknown); None if any item's prompts are unknown."""
    in_order = sorted(answered, key=lambda r: r.index if r.sent_order is None else r.sent_order)
    sent = [r.sent_prompts for r in in_order]
    if any(prompts is None for prompts in sent):
        return None
    return cacheable_prompt_tokens([p for p in sent if p is not None])[0]


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
        eta = "unknown" if self.eta_s is None else format_duration(self.eta_s)
        percent = 100 * self.done / self.total if self.total else 100.0
        return (
            f"{self.done}/{self.total} done ({percent:.0f}%): {self.cache_hits} from cache, "
            f"{self.failed} failed; {format_duration(self.elapsed_s)} elapsed, ETA {eta}"
        )


def format_duration(seconds: float) -> str:
    """A duration as a person reads it on a progress line: 42 s, 3 min 05 s, 2 h 07 min."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


ProgressCallback = Callable[[BatchProgress], None]

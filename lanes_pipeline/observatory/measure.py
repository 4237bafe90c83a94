"""Measuring one lane on the fixed workload: TTFT (streamed), prompt tokens/s on a long prompt, generation
tokens/s at 1 request and at the lane's slots, p50/p95 latency, prefix-cache hits from the server's own
counters, KV-cache use, and PF (generation tokens/s per billion active parameters).

Pure figures first (`percentile`, `prefix_hit`, `LaneFigures`), then the requests. Plain httpx: the
measurement must see the stream itself, and must not retry (a retried request would hide a slow one).
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from lanes_pipeline.config.models import LaneName
from lanes_pipeline.metrics.prometheus import LaneCounters, MetricsSnapshot, lane_counters
from lanes_pipeline.observatory import workload as wl

REQUEST_TIMEOUT_S = 300.0

# ---------------------------------------------------------------------------------------------------------
# Figures (pure)
# ---------------------------------------------------------------------------------------------------------


class Timing(BaseModel):
    """One request as the client saw it, with the usage the server reported."""

    model_config = ConfigDict(frozen=True)

    latency_s: float
    ttft_s: float | None = None  # streamed requests only
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None

    @property
    def decode_tok_s(self) -> float | None:
        """Generation speed after the first token (streamed requests only)."""
        if self.ttft_s is None or self.completion_tokens < 2 or self.latency_s <= self.ttft_s:
            return None
        return (self.completion_tokens - 1) / (self.latency_s - self.ttft_s)


class LaneTarget(BaseModel):
    """A running server to measure: where, which model name to ask for, how many slots, how big."""

    model_config = ConfigDict(frozen=True)

    lane: LaneName
    url: str
    model: str  # the name requests carry (llama-server alias, vLLM served name or adapter name)
    slots: int
    active_params_b: float
    api_key: str | None = None


class LaneFigures(BaseModel):
    """Everything one lane measurement yields; None where the server does not report it."""

    model_config = ConfigDict(frozen=True)

    lane: LaneName
    engine: str
    ttft_s: float
    prompt_tok_s: float
    generation_tok_s: float  # one request at a time
    generation_tok_s_slots: float  # `slots` requests in flight
    slots: int
    p50_s: float
    p95_s: float
    prefix_hit: float | None
    kv_cache_use: float | None
    pf: float  # generation_tok_s / billions of active parameters
    requests: int

    def metadata(self, prefix: str) -> dict[str, float | int | str]:
        """Flat numbers for Dagster metadata (plotted over days); a missing figure is left out, not 0."""
        out: dict[str, float | int | str] = {}
        for key, value in self.model_dump().items():
            if key in ("lane",) or value is None:
                continue
            out[f"{prefix}/{key}"] = round(value, 4) if isinstance(value, float) else value
        return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def pf(generation_tok_s: float, active_params_b: float) -> float:
    return generation_tok_s / active_params_b


def prefix_hit(before: LaneCounters, after: LaneCounters, prompt_tokens_sent: int) -> float | None:
    """Share of prompt tokens the server served from its prefix cache between two scrapes, by its counters.

    vLLM counts queries and hits itself. llama.cpp counts only prompt tokens it evaluated, so what it did not
    evaluate out of what the requests carried came from the cache (recent mainline also counts cached ones).
    """
    if after.prefix_cache_queries_total is not None and before.prefix_cache_queries_total is not None:
        queries = after.prefix_cache_queries_total - before.prefix_cache_queries_total
        hits = (after.prefix_cache_hits_total or 0.0) - (before.prefix_cache_hits_total or 0.0)
        return hits / queries if queries > 0 else None
    evaluated = after.prompt_tokens_total - before.prompt_tokens_total
    if after.prompt_tokens_cached_total is not None and before.prompt_tokens_cached_total is not None:
        cached = after.prompt_tokens_cached_total - before.prompt_tokens_cached_total
        return cached / (cached + evaluated) if cached + evaluated > 0 else None
    if prompt_tokens_sent <= 0:
        return None
    return max(0.0, min(1.0, 1.0 - evaluated / prompt_tokens_sent))


def kv_cache_use(snapshot: MetricsSnapshot) -> float | None:
    """0..1: ik_llama.cpp's ratio or vLLM's percentage gauge (both 0..1); mainline llama-server has none."""
    return snapshot.first(
        "llamacpp:kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"
    )


# ---------------------------------------------------------------------------------------------------------
# Requests (I/O)
# ---------------------------------------------------------------------------------------------------------


def _client(target: LaneTarget) -> httpx.Client:
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    # A fresh connection per request: a kept-alive one that the server has just closed fails the request
    # ("Server disconnected without sending a response", seen once in six trial runs on upstream
    # llama-server); a localhost connect costs well under a millisecond of the figures measured.
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.Client(base_url=target.url, headers=headers, timeout=REQUEST_TIMEOUT_S, limits=limits)


def _usage(body: dict[str, Any]) -> tuple[int, int, int | None]:
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return (
        int(usage.get("prompt_tokens", 0)),
        int(usage.get("completion_tokens", 0)),
        details.get("cached_tokens"),
    )


def post(http: httpx.Client, body: dict[str, Any]) -> Timing:
    started = time.perf_counter()
    response = http.post("/v1/chat/completions", json=body)
    latency = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(
            f"POST {http.base_url}/v1/chat/completions: HTTP {response.status_code}: {response.text[:300]}"
        )
    prompt, completion, cached = _usage(response.json())
    return Timing(latency_s=latency, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


def stream(http: httpx.Client, body: dict[str, Any]) -> Timing:
    """A streamed request: the first chunk that carries text is the first token."""
    started = time.perf_counter()
    first: float | None = None
    chunks, usage_body = 0, {}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(
                f"POST {http.base_url}/v1/chat/completions (stream): HTTP {response.status_code}: "
                f"{response.read()[:300]!r}"
            )
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("usage"):
                usage_body = event
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - started
    latency = time.perf_counter() - started
    prompt, completion, cached = _usage(usage_body)
    return Timing(
        latency_s=latency,
        ttft_s=first if first is not None else latency,
        prompt_tokens=prompt,
        completion_tokens=completion or chunks,  # a server without usage in streams: one token per chunk
        cached_tokens=cached,
    )


def counters(http: httpx.Client) -> tuple[LaneCounters, MetricsSnapshot]:
    response = http.get("/metrics")
    if response.status_code != 200:
        raise RuntimeError(
            f"GET {http.base_url}/metrics: HTTP {response.status_code} (llama-server needs --metrics)"
        )
    snapshot = MetricsSnapshot.from_text(response.text)
    return lane_counters(snapshot), snapshot


class LoadResult(BaseModel):
    timings: list[Timing]
    wall_s: float

    @property
    def generation_tok_s(self) -> float:
        return sum(t.completion_tokens for t in self.timings) / self.wall_s if self.wall_s > 0 else 0.0


def run_load(
    target: LaneTarget,
    bodies: list[dict[str, Any]],
    concurrency: int,
    cap: Callable[[], int | None] | None = None,
    until: threading.Event | None = None,
) -> LoadResult:
    """`concurrency` workers posting `bodies`; `cap()` may lower the in-flight limit at any moment (the yield
    governor); with `until`, the bodies repeat until it is set (a background load)."""
    lock = threading.Condition()
    state = {"next": 0, "in_flight": 0}
    timings: list[Timing] = []
    errors: list[str] = []

    def take() -> dict[str, Any] | None:
        with lock:
            while True:
                if until is None and state["next"] >= len(bodies):
                    return None
                if until is not None and until.is_set():
                    return None
                limit = min(concurrency, (cap() if cap else None) or concurrency)
                if state["in_flight"] < limit:
                    body = bodies[state["next"] % len(bodies)]
                    state["next"] += 1
                    state["in_flight"] += 1
                    return body
                lock.wait(0.2)

    def worker() -> None:
        with _client(target) as http:
            while (body := take()) is not None:
                try:
                    timing = post(http, body)
                except (httpx.HTTPError, RuntimeError) as exc:
                    errors.append(str(exc))
                    timing = None
                with lock:
                    state["in_flight"] -= 1
                    if timing is not None:
                        timings.append(timing)
                    lock.notify_all()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors and not timings:
        raise RuntimeError(f"every request of the load failed on {target.url}: {errors[0]}")
    return LoadResult(timings=timings, wall_s=time.perf_counter() - started)


@contextmanager
def sampling_kv(target: LaneTarget, every_s: float = 0.5) -> Iterator[list[float]]:
    """KV-cache use read from /metrics while the body runs; the list fills with the readings."""
    readings: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        with _client(target) as http:
            while not stop.is_set():
                try:
                    value = kv_cache_use(counters(http)[1])
                except (httpx.HTTPError, RuntimeError, ValueError):
                    value = None
                if value is not None:
                    readings.append(value)
                stop.wait(every_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield readings
    finally:
        stop.set()
        thread.join(timeout=10)


def load_bodies(target: LaneTarget, count: int, max_tokens: int, offset: int = 0) -> list[dict[str, Any]]:
    return [
        wl.chat_body(target.model, wl.messages(wl.question(offset + i), shared=False), max_tokens)
        for i in range(count)
    ]


def measure_lane(target: LaneTarget, work: wl.Workload) -> LaneFigures:
    """The whole measurement of one lane, in an order that keeps each figure clean: warm-up, single streamed
    requests, the long prompt, the prefix phase (sequential, so the first request fills the cache), then the
    load at the lane's slots (KV use sampled during it)."""
    with _client(target) as http:
        # Warm-up: ik_llama.cpp's first answer after start is empty, and every server pages weights in.
        post(http, wl.chat_body(target.model, wl.messages("Say hi.", shared=False), 4))
        singles = [
            stream(
                http,
                wl.chat_body(target.model, wl.messages(wl.question(i), shared=False), work.max_tokens, True),
            )
            for i in range(work.single_requests)
        ]
        longs = [
            post(
                http,
                wl.chat_body(
                    target.model,
                    wl.long_prompt(work.long_prompt_blocks, int(time.time()) + i),
                    1,
                    exact=False,
                ),
            )
            for i in range(work.long_prompt_requests)
        ]
        before, snapshot = counters(http)
        sent = 0
        for i in range(work.prefix_requests):
            sent += post(http, wl.chat_body(target.model, wl.messages(wl.question(i)), 4)).prompt_tokens
        after, _ = counters(http)
    bodies = load_bodies(target, target.slots * work.requests_per_slot, work.max_tokens)
    with sampling_kv(target) as kv_readings:
        load = run_load(target, bodies, target.slots)
    decode = [t.decode_tok_s for t in singles if t.decode_tok_s is not None]
    generation = statistics.median(decode) if decode else 0.0
    latencies = [t.latency_s for t in load.timings]
    return LaneFigures(
        lane=target.lane,
        engine=snapshot.engine,
        ttft_s=statistics.median(t.ttft_s or t.latency_s for t in singles),
        prompt_tok_s=statistics.median(t.prompt_tokens / t.latency_s for t in longs),
        generation_tok_s=generation,
        generation_tok_s_slots=load.generation_tok_s,
        slots=target.slots,
        p50_s=percentile(latencies, 50),
        p95_s=percentile(latencies, 95),
        prefix_hit=prefix_hit(before, after, sent),
        kv_cache_use=max(kv_readings) if kv_readings else None,
        pf=pf(generation, target.active_params_b),
        requests=1 + len(singles) + len(longs) + work.prefix_requests + len(load.timings),
    )

"""Prometheus text from a lane's `/metrics` -> typed figures, for llama-server / ik_llama.cpp and vLLM alike.

Both servers count what they actually computed: an unchanged `prompt_tokens_total` and generation counter
between two scrapes proves that nothing was asked in between, which the client's own counters cannot prove.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict

Engine = Literal["llama.cpp", "vllm", "unknown"]


class MetricsSnapshot(BaseModel):
    """Every sample of one scrape, summed over label sets (vLLM labels by engine and model).

    Histogram buckets are dropped: summing them over `le` means nothing; their `_sum` and `_count` stay.
    """

    model_config = ConfigDict(frozen=True)

    values: dict[str, float]

    @classmethod
    def from_text(cls, text: str) -> MetricsSnapshot:
        totals: dict[str, float] = defaultdict(float)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    continue
                totals[sample.name] += float(sample.value)
        return cls(values=dict(totals))

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def first(self, *names: str) -> float | None:
        """The value of the first of `names` present: metric names drift between server versions."""
        for name in names:
            if name in self.values:
                return self.values[name]
        return None

    @property
    def engine(self) -> Engine:
        if any(name.startswith("llamacpp:") for name in self.values):
            return "llama.cpp"
        if any(name.startswith("vllm:") for name in self.values):
            return "vllm"
        return "unknown"


class LaneCounters(BaseModel):
    """The figures both lanes need, under one set of names.

    `prompt_tokens_total` counts prompt tokens actually evaluated on llama.cpp (prefix-cache hits excluded)
    and prefill tokens on vLLM. The prefix-cache pair is vLLM's; llama.cpp reports reuse per response only.
    """

    model_config = ConfigDict(frozen=True)

    engine: Engine
    prompt_tokens_total: float
    generation_tokens_total: float
    requests_running: float
    requests_waiting: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prompt_tokens_cached_total: float | None = None  # recent mainline llama-server only
    # Mainline llama-server only: decode calls, and the running average of busy slots per call.
    decode_calls_total: float | None = None
    busy_slots_per_decode: float | None = None
    prompt_seconds_total: float | None = None
    generation_seconds_total: float | None = None

    @property
    def prefix_cache_hit_ratio(self) -> float | None:
        if not self.prefix_cache_queries_total or self.prefix_cache_hits_total is None:
            return None
        return self.prefix_cache_hits_total / self.prefix_cache_queries_total

    def tokens_since(self, before: LaneCounters) -> tuple[float, float]:
        """(prompt, generated) tokens the server computed between `before` and this scrape."""
        return (
            self.prompt_tokens_total - before.prompt_tokens_total,
            self.generation_tokens_total - before.generation_tokens_total,
        )


def busy_slots_between(before: LaneCounters, after: LaneCounters) -> float | None:
    """Average busy slots per decode call between two scrapes: how well a client kept the slots full.

    Mainline reports a running average since start; average x calls gives the busy-slot total to diff.
    """
    calls_before, average_before = before.decode_calls_total, before.busy_slots_per_decode
    calls_after, average_after = after.decode_calls_total, after.busy_slots_per_decode
    if calls_before is None or average_before is None or calls_after is None or average_after is None:
        return None
    if calls_after <= calls_before:
        return None
    return (average_after * calls_after - average_before * calls_before) / (calls_after - calls_before)


def lane_counters(snapshot: MetricsSnapshot) -> LaneCounters:
    """Map a scrape to LaneCounters; a missing core counter means the wrong endpoint, so it raises."""
    engine = snapshot.engine
    if engine == "llama.cpp":
        prompt = snapshot.get("llamacpp:prompt_tokens_total")
        generated = snapshot.get("llamacpp:tokens_predicted_total")
        if prompt is None or generated is None:
            raise ValueError("llama.cpp metrics lack llamacpp:prompt_tokens_total / tokens_predicted_total")
        return LaneCounters(
            engine=engine,
            prompt_tokens_total=prompt,
            generation_tokens_total=generated,
            requests_running=snapshot.get("llamacpp:requests_processing") or 0.0,
            requests_waiting=snapshot.get("llamacpp:requests_deferred"),
            prompt_tokens_cached_total=snapshot.get("llamacpp:prompt_tokens_cached_total"),
            decode_calls_total=snapshot.get("llamacpp:n_decode_total"),
            busy_slots_per_decode=snapshot.get("llamacpp:n_busy_slots_per_decode"),
            prompt_seconds_total=snapshot.get("llamacpp:prompt_seconds_total"),
            generation_seconds_total=snapshot.get("llamacpp:tokens_predicted_seconds_total"),
        )
    if engine == "vllm":
        prompt = snapshot.get("vllm:prompt_tokens_total")
        generated = snapshot.get("vllm:generation_tokens_total")
        if prompt is None or generated is None:
            raise ValueError("vLLM metrics lack vllm:prompt_tokens_total / vllm:generation_tokens_total")
        return LaneCounters(
            engine=engine,
            prompt_tokens_total=prompt,
            generation_tokens_total=generated,
            requests_running=snapshot.get("vllm:num_requests_running") or 0.0,
            requests_waiting=snapshot.get("vllm:num_requests_waiting"),
            # vLLM renamed these once (gpu_ prefix dropped); accept both.
            prefix_cache_queries_total=snapshot.first(
                "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"
            ),
            prefix_cache_hits_total=snapshot.first(
                "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"
            ),
        )
    raise ValueError("neither llamacpp:* nor vllm:* metrics found (is this a lane's /metrics?)")


def parse_lane_counters(text: str) -> LaneCounters:
    return lane_counters(MetricsSnapshot.from_text(text))

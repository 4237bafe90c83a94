"""The pure figures of the lane observatory: percentiles, prefix hits from each server's counters, KV use,
PF, interference ratios, and the metadata the Plots tab charts."""

from __future__ import annotations

import pytest

from lanes_pipeline.metrics.prometheus import LaneCounters, MetricsSnapshot
from lanes_pipeline.observatory.benchmark import LaneBenchmark
from lanes_pipeline.observatory.interference import InterferenceFigures, ratio
from lanes_pipeline.observatory.measure import LaneFigures, Timing, kv_cache_use, percentile, pf, prefix_hit
from lanes_pipeline.observatory.workload import SMALL, chat_body, long_prompt, messages


def counters(**values: float) -> LaneCounters:
    base = {
        "engine": "llama.cpp",
        "prompt_tokens_total": 0.0,
        "generation_tokens_total": 0.0,
        "requests_running": 0.0,
    }
    return LaneCounters(**{**base, **values})


def figures(lane: str = "cpu", **changes: object) -> LaneFigures:
    values = {
        "lane": lane,
        "engine": "llama.cpp",
        "ttft_s": 0.2,
        "prompt_tok_s": 300.0,
        "generation_tok_s": 60.0,
        "generation_tok_s_slots": 90.0,
        "slots": 2,
        "p50_s": 0.5,
        "p95_s": 0.9,
        "prefix_hit": 0.75,
        "kv_cache_use": None,
        "pf": 444.4,
        "requests": 12,
    }
    return LaneFigures(**{**values, **changes})


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert percentile(values, 50) == 10.0
    assert percentile(values, 95) == 19.0
    assert percentile([3.0], 95) == 3.0
    assert percentile([5.0, 1.0], 100) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_prefix_hit_from_vllm_counters() -> None:
    before = counters(engine="vllm", prefix_cache_queries_total=100.0, prefix_cache_hits_total=10.0)
    after = counters(engine="vllm", prefix_cache_queries_total=300.0, prefix_cache_hits_total=160.0)
    assert prefix_hit(before, after, prompt_tokens_sent=999) == pytest.approx(150 / 200)
    assert prefix_hit(after, after, prompt_tokens_sent=0) is None  # nothing asked: no figure, not 0


def test_prefix_hit_from_llama_cpp_counters() -> None:
    # llama.cpp counts only evaluated prompt tokens: 400 sent, 100 evaluated -> 75% came from the cache.
    assert prefix_hit(counters(prompt_tokens_total=50.0), counters(prompt_tokens_total=150.0), 400) == 0.75
    # Recent mainline also counts cached tokens: that counter wins.
    before = counters(prompt_tokens_total=0.0, prompt_tokens_cached_total=0.0)
    after = counters(prompt_tokens_total=100.0, prompt_tokens_cached_total=300.0)
    assert prefix_hit(before, after, 10) == 0.75
    assert prefix_hit(counters(), counters(), 0) is None


def test_kv_cache_use_from_ik_and_vllm_but_not_mainline() -> None:
    ik = MetricsSnapshot.from_text(
        "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.25\n"
    )
    vllm = MetricsSnapshot.from_text(
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.5\n'
    )
    mainline = MetricsSnapshot.from_text(
        "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 3\n"
    )
    assert (kv_cache_use(ik), kv_cache_use(vllm), kv_cache_use(mainline)) == (0.25, 0.5, None)


def test_pf_and_decode_speed() -> None:
    assert pf(27.0, 0.135) == pytest.approx(200.0)
    assert pf(30.0, 22.0) == pytest.approx(1.3636, rel=1e-3)  # an MoE: per billion *active* parameters
    streamed = Timing(latency_s=1.5, ttft_s=0.5, prompt_tokens=10, completion_tokens=21)
    assert streamed.decode_tok_s == pytest.approx(20.0)
    assert Timing(latency_s=1.0, prompt_tokens=1, completion_tokens=5).decode_tok_s is None


def test_interference_ratios_and_the_trial_figure() -> None:
    detail = InterferenceFigures(
        cpu_alone=100.0,
        cpu_with_gpu=80.0,
        gpu_alone=50.0,
        gpu_with_cpu_yield_off=25.0,
        gpu_with_cpu_yield_on=45.0,
        cpu_yields=3,
    )
    assert (detail.cpu_ratio, detail.gpu_ratio_yield_off, detail.gpu_ratio_yield_on) == (0.8, 0.5, 0.9)
    assert detail.for_lane("cpu") == 0.8 and detail.for_lane("gpu") == 0.5
    assert detail.metadata()["interference/gpu_ratio_yield_on"] == 0.9
    assert ratio(10.0, 0.0) == 0.0


def test_benchmark_metadata_is_flat_numbers_without_missing_figures() -> None:
    result = LaneBenchmark(cpu=figures(), gpu=figures("gpu", engine="vllm", kv_cache_use=0.125))
    metadata = result.metadata()
    assert metadata["cpu_lane/generation_tok_s"] == 60.0 and metadata["gpu_lane/kv_cache_use"] == 0.125
    assert "cpu_lane/kv_cache_use" not in metadata  # mainline has no KV gauge: absent, never a fake 0
    assert all(isinstance(v, int | float | str) for v in metadata.values())
    assert "| ttft_s | 0.2 | 0.2 |" in result.markdown()


def test_workload_bodies_are_fixed_and_exact() -> None:
    body = chat_body("m", messages("q"), SMALL.max_tokens, stream=True)
    assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}
    assert chat_body("m", messages("q"), 4) == chat_body("m", messages("q"), 4)  # the same every day
    first, second = long_prompt(4, 1), long_prompt(4, 2)
    assert first[0]["content"][:12] != second[0]["content"][:12]  # a nonce first: no cache can serve it

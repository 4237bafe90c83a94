"""The CPU lane's pure parts, without a server: metrics parsing, cache keys, prompt layout, JSON repair
parsing, backoff, summary statistics, the response cache on disk, the slot gate, the batch-file format."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from pathlib import Path

import click
import pytest
from pydantic import BaseModel, field_validator

from lanes_pipeline.bench.cpu_lane import fixed_prefix_requests, naive_requests
from lanes_pipeline.cli.cpu import BatchLine, read_batch_file
from lanes_pipeline.cpu_lane.batching.answer_cache import (
    CacheEntry,
    FailureRecord,
    ResponseCache,
    WeightsIdentity,
    cache_key,
)
from lanes_pipeline.cpu_lane.batching.answer_parsing import extract_json, parse_structured, repair_request
from lanes_pipeline.cpu_lane.batching.batch_models import (
    BatchRequest,
    ItemFailure,
    ItemResult,
    RequestMetrics,
    cached_prompt_tokens,
    request_metrics,
)
from lanes_pipeline.cpu_lane.batching.batch_summary import BatchProgress, percentile, summarize
from lanes_pipeline.cpu_lane.batching.client import (
    ServerProps,
    SlotState,
    per_slot_context,
    shrink_keep_tokens,
)
from lanes_pipeline.cpu_lane.batching.prefix_order import (
    SendOrder,
    cacheable_prompt_tokens,
    common_prefix_len,
    prefix_groups,
    prefix_key,
    shared_prefix_limit,
)
from lanes_pipeline.cpu_lane.batching.slots import SlotGate
from lanes_pipeline.cpu_lane.jobs.prompts import SHORT_ANSWER, PromptLayout, TaskKind, register
from lanes_pipeline.http import ChatMessage, ChatResponse, Timings, Usage, backoff_delay
from lanes_pipeline.metrics.prometheus import MetricsSnapshot, busy_slots_between, parse_lane_counters

LLAMACPP_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 46
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 17
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2-hf"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="smollm2-hf"} 120.0
vllm:prompt_tokens_total{engine="0",model_name="lanes-current"} 30.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="smollm2-hf"} 64.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2-hf"} 150.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2-hf"} 60.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="smollm2-hf"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="smollm2-hf"} 3.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="smollm2-hf"} 3.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="smollm2-hf"} 2.5
"""


def test_llamacpp_metrics_map_to_lane_counters() -> None:
    counters = parse_lane_counters(LLAMACPP_METRICS)
    assert counters.engine == "llama.cpp"
    assert (counters.prompt_tokens_total, counters.generation_tokens_total) == (46, 17)
    assert (counters.requests_running, counters.requests_waiting) == (2, 1)
    assert counters.prefix_cache_hit_ratio is None


def test_vllm_metrics_sum_over_labels_and_skip_buckets() -> None:
    snapshot = MetricsSnapshot.from_text(VLLM_METRICS)
    assert "vllm:e2e_request_latency_seconds_bucket" not in snapshot.values
    assert snapshot.get("vllm:e2e_request_latency_seconds_count") == 3
    counters = parse_lane_counters(VLLM_METRICS)
    assert counters.engine == "vllm"
    assert counters.prompt_tokens_total == 150  # two adapters' series, summed
    assert counters.prefix_cache_hit_ratio == pytest.approx(0.4)
    later = counters.model_copy(update={"prompt_tokens_total": 160.0, "generation_tokens_total": 70.0})
    assert later.tokens_since(counters) == (10, 6)


def test_busy_slots_per_decode_between_two_scrapes() -> None:
    before = parse_lane_counters(
        LLAMACPP_METRICS + "llamacpp:n_decode_total 100\nllamacpp:n_busy_slots_per_decode 1\n"
    )
    after = before.model_copy(update={"decode_calls_total": 300.0, "busy_slots_per_decode": 1.5})
    assert busy_slots_between(before, after) == pytest.approx((450 - 100) / 200)  # 1.75 busy in between
    assert busy_slots_between(before, before) is None
    assert busy_slots_between(parse_lane_counters(LLAMACPP_METRICS), after) is None  # ik: not reported


def test_metrics_that_are_no_lane_metrics_are_an_error() -> None:
    with pytest.raises(ValueError, match="neither"):
        parse_lane_counters("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n")


def _request(content: str = "hi", **changes: object) -> BatchRequest:
    return BatchRequest(
        id="x", messages=[ChatMessage(role="user", content=content)], max_tokens=8
    ).model_copy(update=changes)


def test_cache_key_covers_request_and_weights_but_not_alias_or_id() -> None:
    weights = WeightsIdentity(configured_model="m", model_path="/a.gguf", meta={"size": 1}).fingerprint()
    base = cache_key(_request().chat_request("alias-a"), weights)
    assert cache_key(_request().chat_request("alias-b"), weights) == base  # alias: not the weights
    assert cache_key(_request().model_copy(update={"id": "y"}).chat_request("alias-a"), weights) == base
    assert cache_key(_request("hi!").chat_request("alias-a"), weights) != base
    assert cache_key(_request(max_tokens=9).chat_request("alias-a"), weights) != base
    assert cache_key(_request(temperature=0.5).chat_request("alias-a"), weights) != base
    assert cache_key(_request(json_schema={"type": "object"}).chat_request("alias-a"), weights) != base
    assert cache_key(_request(ignore_eos=True).chat_request("alias-a"), weights) != base
    assert "ignore_eos" not in _request().chat_request("alias-a").payload()  # keys cached before it stay
    other_file = WeightsIdentity(configured_model="m", model_path="/b.gguf", meta={"size": 1}).fingerprint()
    other_name = WeightsIdentity(configured_model="n", model_path="/a.gguf", meta={"size": 1}).fingerprint()
    other_size = WeightsIdentity(configured_model="m", model_path="/a.gguf", meta={"size": 2}).fingerprint()
    assert len({weights, other_file, other_name, other_size}) == 4
    assert cache_key(_request().chat_request("alias-a"), other_file) != base


def test_prompt_layout_prefix_bytes_are_identical_and_the_varying_part_is_last() -> None:
    layout = PromptLayout(SHORT_ANSWER, shared_context="repo map: a.py b.py")
    items = [layout.build(f"item-{i}", f"What is {i} plus {i}?") for i in range(5)]
    prefixes = set()
    for item in items:
        assert item.varying_from is not None
        system, user = item.messages
        prefixes.add((system.role, system.content, user.role, user.content[: item.varying_from]))
        assert user.content.endswith(item.messages[-1].content[item.varying_from :])
        assert item.id not in system.content + user.content[: item.varying_from]  # ids never in the prefix
    assert len(prefixes) == 1
    system_prompt = items[0].messages[0].content
    assert json.dumps(SHORT_ANSWER.json_schema(), sort_keys=True, separators=(",", ": ")) in system_prompt
    assert system_prompt.index("repo map") > system_prompt.index("JSON schema")  # schema, then context
    assert items[0].json_schema == SHORT_ANSWER.json_schema()


def test_task_kinds_register_once() -> None:
    kind = TaskKind(name="unit_test_kind", instructions="Do it.")
    assert register(kind) is kind
    assert register(TaskKind(name="unit_test_kind", instructions="Do it.")) == kind
    with pytest.raises(ValueError, match="already registered"):
        register(TaskKind(name="unit_test_kind", instructions="Do something else."))


class Verdict(BaseModel):
    answer: str

    @field_validator("answer")
    @classmethod
    def _short(cls, value: str) -> str:
        if len(value) > 5:
            raise ValueError("longer than 5 characters")
        return value


def test_parse_structured_accepts_fences_and_prose_and_reports_why_not() -> None:
    assert extract_json('```json\n{"answer": "4"}\n```') == {"answer": "4"}
    assert extract_json('Sure! {"answer": "4"} hope that helps') == {"answer": "4"}
    assert parse_structured('{"answer": "4"}', Verdict).value == {"answer": "4"}
    truncated = parse_structured('{"answer": "fou', Verdict)
    assert not truncated.ok and "not valid JSON" in truncated.error
    invalid = parse_structured('{"answer": "much too long"}', Verdict)
    assert not invalid.ok and "answer" in invalid.error and "longer than 5" in invalid.error
    assert parse_structured("   ", Verdict).error == "empty answer"
    assert parse_structured('{"anything": 1}', None).value == {"anything": 1}


def test_repair_request_keeps_the_conversation_and_doubles_a_truncated_budget() -> None:
    request = _request("question", json_schema={"type": "object"}, varying_from=0)
    repaired = repair_request(request, '{"answer": "fou', "not valid JSON", truncated=True)
    assert repaired.messages[: len(request.messages)] == request.messages  # prefix reuse for the repair
    assert [m.role for m in repaired.messages[-2:]] == ["assistant", "user"]
    assert "not valid JSON" in repaired.messages[-1].content
    assert repaired.max_tokens == 2 * request.max_tokens and repaired.varying_from is None
    assert repair_request(request, "x", "e", truncated=False).max_tokens == request.max_tokens


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    rng = random.Random(1)
    for attempt, ceiling in ((1, 1.0), (2, 2.0), (3, 4.0), (6, 10.0), (9, 10.0)):
        delays = [backoff_delay(attempt, 1.0, 10.0, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 100  # jittered, not a fixed delay


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([float(v) for v in range(1, 21)], 95) == pytest.approx(19.05)


def test_request_metrics_cached_tokens_from_usage_or_timings_and_truncation() -> None:
    with_details = Usage.model_validate(
        {"prompt_tokens": 45, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 44}}
    )
    assert cached_prompt_tokens(with_details, Timings(prompt_n=1)) == 44
    assert cached_prompt_tokens(Usage(prompt_tokens=45), Timings(prompt_n=5)) == 40
    assert cached_prompt_tokens(Usage(prompt_tokens=45), None) is None
    response = ChatResponse.model_validate(
        {
            "choices": [{"message": {"content": "abc"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 45, "completion_tokens": 8},
            "timings": {"prompt_n": 5, "predicted_per_second": 70.0, "prompt_per_second": 110.0},
        }
    )
    metrics = request_metrics(response, 0.5, max_tokens=8)
    assert metrics.truncated  # ik says "stop" at max_tokens: the count decides
    assert (metrics.cached_prompt_tokens, metrics.generation_tokens_per_s) == (40, 70.0)
    assert not request_metrics(response, 0.5, max_tokens=9).truncated


def _ok(
    index: int, latency: float, prompt: int, cached: int, completion: int, hit: bool = False
) -> ItemResult:
    metrics = RequestMetrics(
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        completion_tokens=completion,
        prompt_tokens_per_s=None,
        generation_tokens_per_s=None,
        latency_s=latency,
        truncated=False,
    )
    return ItemResult(
        index=index,
        id=str(index),
        key=str(index),
        status="ok",
        from_cache=hit,
        text="t",
        metrics=metrics,
        requests_sent=0 if hit else 1,
    )


def test_summary_counts_hits_failures_latency_and_reuse() -> None:
    results = [
        _ok(0, 1.0, 100, 0, 10),
        _ok(1, 2.0, 100, 80, 10),
        _ok(2, 3.0, 100, 80, 10),
        _ok(3, 9.0, 100, 80, 10, hit=True),  # a hit: excluded from latency and token figures
        ItemResult(
            index=4,
            id="4",
            key="4",
            status="failed",
            requests_sent=3,
            failure=ItemFailure(kind="unreachable", reason="down"),
        ),
    ]
    summary = summarize(results, wall_s=2.0)
    assert (summary.items, summary.ok, summary.failed, summary.cache_hits, summary.answered) == (
        5,
        4,
        1,
        1,
        3,
    )
    assert summary.requests_sent == 6 and summary.failure_ratio == pytest.approx(0.2)
    assert summary.failures_by_kind == {"unreachable": 1}
    assert summary.latency_p50_s == 2.0 and summary.latency_p95_s == pytest.approx(2.9)
    assert summary.prefix_cache_reuse == pytest.approx(160 / 300)
    assert summary.generation_tokens_per_s == 15.0 and summary.prompt_tokens_per_s == 70.0
    assert summary.metadata()["failed"] == 1 and "failures_by_kind" not in summary.metadata()


def test_summary_sets_the_reuse_beside_what_a_perfect_cache_could_serve() -> None:
    def answered(index: int, *prompts: tuple[int, ...]) -> ItemResult:
        item = _ok(index, 1.0, len(prompts[-1]), 0, 1)
        return item.model_copy(update={"sent_prompts": list(prompts)})

    prefix = tuple(range(100))
    results = [
        answered(1, (*prefix, 7, 7)),  # listed out of order: the limit follows the input order
        answered(0, (*prefix, 5)),  # the group's first: nothing before it to reuse
        answered(2, (*prefix, 9), (*prefix, 9)),  # an empty answer asked again: its first try is reusable
    ]
    summary = summarize(results, wall_s=1.0)
    assert summary.cacheable_prompt_tokens == 100 + 101
    assert summary.prefix_reuse_limit == pytest.approx(201 / (101 + 102 + 101))
    assert "sent_prompts" not in results[0].model_dump()  # token ids stay in memory, never in a file
    unknown = summarize([*results, _ok(3, 1.0, 50, 0, 1)], wall_s=1.0)  # a server that renders nothing
    assert unknown.cacheable_prompt_tokens is None and unknown.prefix_reuse_limit is None


def test_cacheable_prompt_tokens_count_earlier_prompts_and_own_tries() -> None:
    assert common_prefix_len([1, 2, 3, 4], [1, 2, 3, 9]) == 3
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2 and common_prefix_len([], [1]) == 0
    assert common_prefix_len(list(range(5000)), [*range(4321), -1]) == 4321
    first, repair = (1, 2, 3), (1, 2, 3, 4, 5)  # a repair extends the prompt it answers
    assert cacheable_prompt_tokens([[first, repair]]) == (3, 5)
    assert cacheable_prompt_tokens([[(1, 2)], [(1, 2, 3)], []]) == (2, 5)


def test_progress_eta_from_the_answered_rate() -> None:
    progress = BatchProgress(total=10, done=6, cache_hits=4, failed=0, elapsed_s=4.0, answered=2)
    assert progress.eta_s == pytest.approx(8.0)
    assert "6/10 done" in progress.line() and "4 from cache" in progress.line()
    assert BatchProgress(10, 10, 10, 0, 0.1, 0).eta_s == 0.0
    assert BatchProgress(10, 4, 4, 0, 0.1, 0).eta_s is None


def test_shrink_budget_leaves_room_for_prefix_marker_and_answer() -> None:
    keep = shrink_keep_tokens(
        prompt_tokens=3000, varying_tokens=2500, marker_tokens=5, max_tokens=64, per_slot_ctx=2048
    )
    assert keep == 2048 - 64 - 500 - 5 - 4
    assert shrink_keep_tokens(3000, 100, 5, 64, 2048) <= 0  # the fixed part alone is too long


def test_per_slot_context_from_ik_props_or_mainline_slots() -> None:
    ik = ServerProps(total_slots=2, n_ctx=4096)
    assert per_slot_context(ik, None)[:2] == (4096, 2048)
    split = ServerProps(total_slots=2, default_generation_settings={"n_ctx": 2048})
    assert per_slot_context(split, [SlotState(id=0, n_ctx=2048), SlotState(id=1, n_ctx=2048)])[:2] == (
        4096,
        2048,
    )


def _entry(key: str, text: str = "answer") -> CacheEntry:
    return CacheEntry(key=key, fingerprint="fp", item_id=key, text=text, metrics={"latency_s": 0.1})


def test_cache_commits_each_answer_in_wal_mode_and_failures_are_not_hits(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    cache = ResponseCache(path)
    assert cache.journal_mode() == "wal"
    cache.record_failure(
        FailureRecord(
            key="k2",
            fingerprint="fp",
            item_id="b",
            kind="unreachable",
            reason="down",
            attempts=3,
            failed_at=time.time(),
        )
    )
    cache.put(_entry("k1"))
    # Another connection (another process, after a kill) sees the committed answer at once.
    with sqlite3.connect(path) as other:
        assert other.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 1
    assert cache.get("k2") is None and [f.item_id for f in cache.failures()] == ["b"]
    cache.put(_entry("k2"))
    assert cache.failures() == []  # a later success clears the failure
    assert set(cache.get_many(["k1", "k2", "k3"])) == {"k1", "k2"}
    cache.close()
    with ResponseCache(path) as reopened:
        entry = reopened.get("k1")
        assert entry is not None and entry.text == "answer" and entry.created_at > 0
        assert reopened.count() == 2 and reopened.count("other") == 0


def test_slot_gate_bounds_threads_and_processes_sharing_a_lease_dir(tmp_path: Path) -> None:
    first, second = SlotGate(1, tmp_path), SlotGate(1, tmp_path)  # two "processes": separate lock handles
    entered = threading.Event()

    def use_second() -> None:
        with second.hold():
            entered.set()

    with first.hold():
        thread = threading.Thread(target=use_second)
        thread.start()
        assert not entered.wait(0.3)  # the only slot is leased by `first`
    assert entered.wait(5)
    thread.join()

    gate = SlotGate(2)
    peak = []

    def work() -> None:
        with gate.hold():
            peak.append(gate.in_flight)
            time.sleep(0.02)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gate.max_in_flight == 2 and max(peak) == 2


def test_batch_file_forms_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    lines = [
        {"id": "a", "prompt": "What is 2+2?"},
        {"task": "short_answer", "input": "Capital of France?", "context": "geography"},
        {"id": "c", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    a, b, c = read_batch_file(path)
    assert (a.id, b.id, c.id) == ("a", "line-2", "c")
    assert b.json_schema == SHORT_ANSWER.json_schema() and "geography" in b.messages[0].content
    assert c.max_tokens == 4 and c.varying_from is None
    path.write_text(
        json.dumps({"prompt": "x", "messages": []}) + "\n" + json.dumps({"task": "nope", "input": "x"})
    )
    with pytest.raises(click.ClickException) as error:
        read_batch_file(path)
    assert ":1: " in error.value.message and ":2: " in error.value.message and "nope" in error.value.message
    with pytest.raises(ValueError, match="needs an input"):
        BatchLine(task="short_answer")


def test_bench_shared_prefix_limit_and_naive_layout() -> None:
    assert shared_prefix_limit([[1, 2, 3, 4], [1, 2, 3, 9], [7, 2, 3, 4]]) == pytest.approx(3 / 12)
    assert shared_prefix_limit([[5, 6], [5, 6]]) == pytest.approx(0.5)  # the first prompt can never reuse
    fixed, naive = fixed_prefix_requests(["f(x)", "g(y)"]), naive_requests(["f(x)", "g(y)"])
    assert fixed[0].messages[0].content == fixed[1].messages[0].content
    assert naive[0].messages[0].content.startswith("Function: f(x)")  # the varying part first
    assert fixed[0].messages[0].content in naive[0].messages[0].content  # the same words, other order


def test_requests_sharing_a_prefix_wait_for_the_first_of_their_group() -> None:
    a = PromptLayout(SHORT_ANSWER, shared_context="repo A")
    b = PromptLayout(SHORT_ANSWER, shared_context="repo B")
    loose = BatchRequest(id="loose", messages=[ChatMessage(role="user", content="no varying part")])
    requests = [a.build("a1", "x"), b.build("b1", "y"), a.build("a2", "z"), loose, a.build("a3", "w")]
    assert prefix_key(requests[0]) == prefix_key(requests[2]) != prefix_key(requests[1])
    assert prefix_key(loose) is None
    first, waiting = prefix_groups(requests, [0, 1, 2, 3, 4])
    assert first == [0, 1, 3] and waiting == {0: [2, 4]}
    # Already answered items do not lead: the first pending one of the group does.
    assert prefix_groups(requests, [2, 4]) == ([2], {2: [4]})


def test_the_next_request_is_the_rest_of_the_group_whose_request_just_freed_its_slot() -> None:
    """Groups a (0: 1, 2), b (3: 4, 5), c (6: 7) and a loose item 8, on 2 slots."""
    order = SendOrder([0, 3, 6, 8], {0: [1, 2], 3: [4, 5], 6: [7]})
    assert [order.next_after(None), order.next_after(None)] == [0, 3]  # two groups start, one per slot
    assert order.ended(0) and order.next_after(0) == 1  # a's rest goes where a's prefix is
    assert order.ended(3) and order.next_after(3) == 4
    assert not order.ended(1) and order.next_after(1) == 2  # a's slot stays on a
    assert not order.ended(2) and order.next_after(2) == 6  # a is done: c starts in that slot
    assert not order.ended(4) and order.next_after(4) == 5
    assert not order.ended(5) and order.next_after(5) == 8  # b done, c's rest not released yet: the loose one
    assert order.waiting == {6: [7]} and order.next_after(8) is None  # nothing ready until c's first ends
    assert order.ended(6) and not order.waiting
    assert order.next_after(8) == 7  # from another slot: nothing better is left
    assert order.next_after(7) is None

"""Retry rules of the batch runner for faults the real llama-server cannot be made to produce on demand.

FAKE SERVER, on purpose: a 5xx in the middle of a completion, a 4xx, and ik_llama.cpp's empty first
answer cannot be triggered at will on the embedded mainline llama-server, so this file serves them from
an httpx.MockTransport shaped like ik_llama.cpp's answers. Connection errors, timeouts of a killed
server, readiness, the API key and everything else are tested against the real server
(test_cpu_faults.py, test_cpu_batch.py).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from lanes_pipeline.cpu_lane.batching.answer_cache import ResponseCache
from lanes_pipeline.cpu_lane.batching.batch import BatchRunner
from lanes_pipeline.cpu_lane.batching.batch_models import BatchConfig, BatchRequest
from lanes_pipeline.cpu_lane.batching.batch_outcomes import EMPTY_RESEED_STEP
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.errors import AuthenticationError
from lanes_pipeline.http import ChatMessage
from lanes_pipeline.settings import CpuLane, RetryPolicy

URL = "http://fake-ik-llama"


class FakeIkServer:
    """Answers like ik_llama.cpp; each item's question says which fault it gets."""

    def __init__(self) -> None:
        self.completions: Counter[str] = Counter()
        self.seeds: dict[str, list[int | None]] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200, json={"status": "ok", "slots_idle": 2, "slots_processing": 0})
        if path == "/props":
            return httpx.Response(200, json={"total_slots": 2, "n_ctx": 4096, "model_path": "/models/x.gguf"})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "smollm2", "meta": {"size": 1, "n_params": 2}}]})
        body = json.loads(request.content)
        if path == "/apply-template":
            return httpx.Response(200, json={"prompt": " ".join(m["content"] for m in body["messages"])})
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": list(range(len(body["content"].split())))})
        assert path == "/v1/chat/completions"
        assert "id_slot" not in body  # never sent: an unknown slot is deferred forever
        item = body["messages"][-1]["content"]
        self.completions[item] += 1
        self.seeds.setdefault(item, []).append(body.get("seed"))
        n = self.completions[item]
        if item == "flaky" and n <= 2:
            return httpx.Response(500, json={"error": {"code": 500, "message": "decode failed"}})
        if item == "bad":
            return httpx.Response(400, json={"error": {"code": 400, "message": "invalid request"}})
        if item == "down":
            return httpx.Response(502, text="bad gateway")
        if item == "locked":
            return httpx.Response(401, json={"error": {"code": 401, "message": "Invalid API Key"}})
        if item == "always-empty":  # end-of-text at once, unless told to ignore it
            content = f"answer to {item}" if body.get("ignore_eos") else ""
            return httpx.Response(200, json=_completion(content))
        if item == "empty-sampled":  # its own seed draws end-of-text at once, any other an answer
            content = "" if body.get("seed") == 3 else f"answer to {item}"
            return httpx.Response(200, json=_completion(content))
        content = "" if item == "empty-first" and n == 1 else f"answer to {item}"
        return httpx.Response(200, json=_completion(content))


def _completion(content: str) -> dict[str, object]:
    return {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1 if not content else 3, "total_tokens": 13},
        "timings": {"prompt_n": 2, "prompt_per_second": 100.0, "predicted_per_second": 50.0},
    }


def _request(item: str) -> BatchRequest:
    return BatchRequest(id=item, messages=[ChatMessage(role="user", content=item)], max_tokens=8)


def _runner(server: FakeIkServer, tmp_path: Path) -> tuple[BatchRunner, ResponseCache]:
    client = CpuClient(
        URL, retry=RetryPolicy(max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.02), seed=0
    )
    client.http = httpx.Client(base_url=URL, transport=httpx.MockTransport(server))
    cache = ResponseCache(tmp_path / "c.sqlite3")
    config = BatchConfig.of(CpuLane(model="m"))
    return BatchRunner(client, cache, config), cache


def test_5xx_and_empty_answers_are_retried_4xx_is_not(tmp_path: Path) -> None:
    server = FakeIkServer()
    runner, cache = _runner(server, tmp_path)
    items = ["flaky", "bad", "down", "empty-first", "fine"]
    result = runner.run([_request(item) for item in items])
    by_id = {r.id: r for r in result.results}
    assert [r.id for r in result.results] == items
    assert by_id["flaky"].status == "ok" and by_id["flaky"].requests_sent == 3  # 500, 500, then the answer
    assert by_id["bad"].failure is not None and by_id["bad"].failure.kind == "http_error"
    assert by_id["bad"].requests_sent == 1 and server.completions["bad"] == 1  # 4xx: never retried
    assert by_id["down"].failure is not None and by_id["down"].failure.kind == "server_error"
    assert server.completions["down"] == 3 and "after 3 attempts" in by_id["down"].failure.reason
    assert by_id["empty-first"].text == "answer to empty-first" and by_id["empty-first"].requests_sent == 2
    assert by_id["fine"].requests_sent == 1
    # The thrown-away empty answer is counted with its token: the server's counters include it too.
    empty_first = by_id["empty-first"]
    assert (empty_first.discarded_answers, empty_first.discarded_completion_tokens) == (1, 1)
    assert (result.summary.discarded_answers, result.summary.discarded_completion_tokens) == (1, 1)
    assert result.summary.completion_tokens == 3 * 3  # the three answers kept
    cached = set(cache.get_many([r.key for r in result.results]))
    cache.close()
    assert cached == {by_id[i].key for i in ("flaky", "empty-first", "fine")}  # no failure, no empty answer
    assert result.summary.failures_by_kind == {"http_error": 1, "server_error": 1}


def test_a_refused_key_mid_batch_ends_the_batch(tmp_path: Path) -> None:
    runner, cache = _runner(FakeIkServer(), tmp_path)
    with cache, pytest.raises(AuthenticationError, match="refused the API key"):
        runner.run([_request("fine"), _request("locked")])


def test_an_empty_sampled_answer_is_asked_again_with_another_seed(tmp_path: Path) -> None:
    """A sampled request's own seed draws the same end-of-text again: the next try moves the seed."""
    server = FakeIkServer()
    runner, cache = _runner(server, tmp_path)
    sampled = _request("empty-sampled").model_copy(update={"temperature": 0.7, "seed": 3})
    started = time.monotonic()
    with cache:
        result = runner.run([sampled])
        again = runner.run([sampled])
    assert time.monotonic() - started < 1.0
    assert result.results[0].text == "answer to empty-sampled" and result.results[0].discarded_answers == 1
    assert server.seeds["empty-sampled"] == [3, 3 + EMPTY_RESEED_STEP]
    assert again.results[0].from_cache and server.completions["empty-sampled"] == 2  # cached as asked


def test_a_free_text_request_empty_on_every_try_ignores_end_of_text_on_its_last(tmp_path: Path) -> None:
    server = FakeIkServer()
    runner, cache = _runner(server, tmp_path)
    structured = BatchRequest(
        id="always-empty-json",
        messages=[ChatMessage(role="user", content="always-empty")],
        json_schema={"type": "object"},
    )
    with cache:
        result = runner.run([_request("always-empty")])
        kept = runner.run([structured])  # a grammar's end must stay reachable: no ignore_eos there
    item = result.results[0]
    assert item.status == "ok" and item.text == "answer to always-empty" and item.discarded_answers == 2
    assert server.completions["always-empty"] == 3 + 3  # 3 tries each (max_attempts 3); only 1 ignored EOS
    assert kept.results[0].status == "failed" and kept.results[0].failure.kind == "empty"

"""CPU-lane benchmark, on a private embedded llama-server started for it:

(a) throughput: the lanes client (BatchRunner, fresh cache so every item is sent) against a plain load
    generator that keeps every slot busy with the same requests, measured in one run. The passes run in
    ABBA order after an untimed warm-up, so neither side profits from prompts the other already cached.
(b) prefix-cache reuse: the same items laid out with the fixed prefix (varying part last) and naively
    (varying part first), each beside its theoretical shared-prefix limit: for every prompt, the longest
    token prefix it shares with any earlier prompt of the batch, over all prompt tokens.
"""

from __future__ import annotations

import os
import queue
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from lanes_pipeline.cpu_lane.batching.answer_cache import ResponseCache
from lanes_pipeline.cpu_lane.batching.batch import BatchRunner
from lanes_pipeline.cpu_lane.batching.batch_models import BatchConfig, BatchRequest
from lanes_pipeline.cpu_lane.batching.batch_summary import BatchSummary
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.batching.prefix_order import shared_prefix_limit
from lanes_pipeline.cpu_lane.jobs.prompts import PromptLayout, TaskKind
from lanes_pipeline.embedded.servers import EmbeddedServer, build_server
from lanes_pipeline.http import ChatMessage
from lanes_pipeline.metrics.prometheus import busy_slots_between
from lanes_pipeline.settings import Settings

# Small enough for two busy cores; raise them on a real workstation for steadier figures.
ITEMS = int(os.environ.get("LANES_BENCH_CPU_ITEMS", "16"))
MAX_TOKENS = int(os.environ.get("LANES_BENCH_CPU_MAX_TOKENS", "16"))
# ABBA rounds: each adds two passes per side; more rounds, steadier ratio.
ROUNDS = int(os.environ.get("LANES_BENCH_CPU_ROUNDS", "1"))
TARGET_RATIO = 0.95

BENCH_TASK = TaskKind(
    name="bench_describe",
    instructions="You are a code assistant. Describe in one sentence what the named function probably does.",
    lead="Function: ",
    max_tokens=MAX_TOKENS,
)
# Shared context standing in for a repo map: a few hundred tokens every item of the task shares.
REPO_MAP = "\n".join(
    f"src/module_{i}.py: def load_{i}(path), def save_{i}(path, data), class Store{i}(cache, timeout)"
    for i in range(6)
)
VERBS = ("parse", "render", "merge", "validate", "compress", "index", "fetch", "retry")
NOUNS = ("config", "manifest", "diff", "token", "schema", "record", "session", "patch")


def _items(offset: int, count: int = ITEMS) -> list[str]:
    return [
        f"{VERBS[(offset + i) % 8]}_{NOUNS[(offset + i * 3) % 8]}_{offset + i}(data)" for i in range(count)
    ]


def fixed_prefix_requests(items: list[str]) -> list[BatchRequest]:
    layout = PromptLayout(BENCH_TASK, shared_context=REPO_MAP)
    return [layout.build(f"item-{i}", item) for i, item in enumerate(items)]


def naive_requests(items: list[str]) -> list[BatchRequest]:
    """The anti-pattern: the varying part first, the fixed instructions and context after it."""
    layout = PromptLayout(BENCH_TASK, shared_context=REPO_MAP)
    return [
        BatchRequest(
            id=f"item-{i}",
            messages=[ChatMessage(role="user", content=f"{BENCH_TASK.lead}{item}\n\n{layout.system_prompt}")],
            max_tokens=MAX_TOKENS,
        )
        for i, item in enumerate(items)
    ]


def _rendered_tokens(client: CpuClient, requests: list[BatchRequest]) -> list[list[int]]:
    tokens = []
    for request in requests:
        rendered = client.apply_template(request.messages)
        if rendered is None:
            raise RuntimeError("the server has no /apply-template: the limit needs the rendered prompts")
        tokens.append(client.tokenize(rendered, add_special=True))
    return tokens


def plain_load(url: str, payloads: list[dict[str, Any]], concurrency: int) -> dict[str, float]:
    """The reference: `concurrency` threads posting the payloads back to back, nothing else."""
    work: queue.Queue[dict[str, Any]] = queue.Queue()
    for payload in payloads:
        work.put(payload)
    totals = {"completion_tokens": 0, "prompt_tokens": 0, "requests": 0}
    lock = threading.Lock()

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            while True:
                try:
                    payload = work.get_nowait()
                except queue.Empty:
                    return
                usage = http.post("/v1/chat/completions", json=payload).raise_for_status().json()["usage"]
                with lock:
                    totals["completion_tokens"] += usage["completion_tokens"]
                    totals["prompt_tokens"] += usage["prompt_tokens"]
                    totals["requests"] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {**totals, "wall_s": time.perf_counter() - started}


def client_run(client: CpuClient, config: BatchConfig, requests: list[BatchRequest]) -> BatchSummary:
    with tempfile.TemporaryDirectory() as folder, ResponseCache(Path(folder) / "bench.sqlite3") as cache:
        result = BatchRunner(client, cache, config).run(requests)
    if result.summary.failed:
        raise RuntimeError(f"bench batch had failures: {[r.failure for r in result.failed()]}")
    return result.summary


def _one_pass(
    side: str, client: CpuClient, config: BatchConfig, requests: list[BatchRequest], slots: int
) -> dict[str, float]:
    """One timed pass, with the server's own view of it: busy slots per decode call (mainline only)."""
    before = client.counters()
    if side == "plain":
        payloads = [r.chat_request(config.model_alias).payload() for r in requests]
        figures = plain_load(client.base_url, payloads, slots)
    else:
        s = client_run(client, config, requests)
        figures = {
            "completion_tokens": s.completion_tokens,
            "prompt_tokens": s.prompt_tokens,
            "requests": s.requests_sent,
            "wall_s": s.wall_s,
        }
    busy = busy_slots_between(before, client.counters())
    return {**figures, **({"busy_slots_per_decode": busy} if busy is not None else {})}


def _throughput(client: CpuClient, config: BatchConfig, slots: int) -> dict[str, Any]:
    requests = fixed_prefix_requests(_items(offset=1000))
    payloads = [r.chat_request(config.model_alias).payload() for r in requests]
    # Warm-up: the server sees every prompt once (one token each), so its prompt caches favour neither side.
    plain_load(client.base_url, [{**p, "max_tokens": 1} for p in payloads], slots)
    passes: dict[str, list[dict[str, float]]] = {"plain": [], "client": []}
    for side in ("plain", "client", "client", "plain") * ROUNDS:  # ABBA: drift hits both sides alike
        passes[side].append(_one_pass(side, client, config, requests, slots))
    figures = {}
    for side, runs in passes.items():
        wall = sum(r["wall_s"] for r in runs)
        busy = [r["busy_slots_per_decode"] for r in runs if "busy_slots_per_decode" in r]
        figures[side] = {
            "generation_tokens_per_s": round(sum(r["completion_tokens"] for r in runs) / wall, 2),
            "requests_per_s": round(sum(r["requests"] for r in runs) / wall, 3),
            "busy_slots_per_decode": round(sum(busy) / len(busy), 3) if busy else None,
            "wall_s": round(wall, 2),
            "passes": [{k: round(v, 3) for k, v in r.items()} for r in runs],
        }
    ratio = figures["client"]["generation_tokens_per_s"] / figures["plain"]["generation_tokens_per_s"]
    request_ratio = figures["client"]["requests_per_s"] / figures["plain"]["requests_per_s"]
    return {
        **figures,
        "ratio": round(ratio, 3),
        "requests_ratio": round(request_ratio, 3),
        "target": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
        "items_per_pass": len(requests),
        "passes_per_side": 2 * ROUNDS,
        "max_tokens": MAX_TOKENS,
        "concurrency": slots,
    }


def _prefix_reuse(client: CpuClient, config: BatchConfig) -> dict[str, Any]:
    items = _items(offset=0)
    layouts = {"fixed_prefix": fixed_prefix_requests(items), "naive_varying_first": naive_requests(items)}
    out: dict[str, Any] = {}
    for name, requests in layouts.items():
        summary = client_run(client, config, requests)
        out[name] = {
            "measured_reuse": round(summary.prefix_cache_reuse or 0.0, 4),
            "theoretical_limit": round(shared_prefix_limit(_rendered_tokens(client, requests)), 4),
            "prompt_tokens": summary.prompt_tokens,
            "cached_prompt_tokens": summary.cached_prompt_tokens,
            "prompt_tokens_per_s": round(summary.prompt_tokens_per_s, 1),
            "wall_s": summary.wall_s,
        }
    return out


def _markdown(throughput: dict[str, Any], reuse: dict[str, Any]) -> str:
    plain, mine = throughput["plain"], throughput["client"]
    verdict = "meets" if throughput["meets_target"] else "MISSES"
    lines = [
        f"Throughput, {throughput['items_per_pass']} requests x {throughput['passes_per_side']} passes "
        f"per side, max_tokens {throughput['max_tokens']}, {throughput['concurrency']} in flight "
        f"({verdict} the >= {throughput['target']} target):",
        "",
        "| measure | plain load generator | lanes client | ratio |",
        "|---|---|---|---|",
        f"| generation tok/s | {plain['generation_tokens_per_s']} | {mine['generation_tokens_per_s']} "
        f"| {throughput['ratio']} |",
        f"| requests/s | {plain['requests_per_s']} | {mine['requests_per_s']} "
        f"| {throughput['requests_ratio']} |",
        f"| busy slots per decode (server) | {plain['busy_slots_per_decode']} "
        f"| {mine['busy_slots_per_decode']} | |",
        "",
        "Prefix-cache reuse on the same batch (cached prompt tokens / prompt tokens):",
        "",
        "| layout | measured reuse | theoretical shared-prefix limit | prompt tokens |",
        "|---|---|---|---|",
    ]
    for name, label in (
        ("fixed_prefix", "fixed prefix, varying last"),
        ("naive_varying_first", "naive, varying first"),
    ):
        r = reuse[name]
        lines.append(
            f"| {label} | {r['measured_reuse']:.1%} | {r['theoretical_limit']:.1%} | {r['prompt_tokens']} |"
        )
    return "\n".join(lines)


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM (`timeout`, a CI cancel) unwinds like Ctrl-C: the private server is stopped, not orphaned."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(settings: Settings) -> dict[str, Any]:
    server = build_server(settings, "cpu", port=0, publish=False)
    with _sigterm_unwinds():
        try:
            return _measure(server.start(), settings)
        finally:
            server.stop()


def _measure(server: EmbeddedServer, settings: Settings) -> dict[str, Any]:
    lane = settings.lanes.cpu_lane
    with CpuClient(server.url, lane.api_key(), timeout_s=lane.request_timeout_s) as client:
        info = client.server_info(lane.model)
        slots = max(1, min(lane.max_slots, info.total_slots))
        config = BatchConfig.of(lane, max_slots=slots)
        reuse = _prefix_reuse(client, config)  # first: a fresh server, neither layout seen before
        throughput = _throughput(client, config, slots)
    return {
        "server": {"url": info.url, "server": info.server, "slots": info.total_slots, "n_ctx": info.n_ctx},
        "throughput": throughput,
        "prefix_reuse": reuse,
        "markdown": _markdown(throughput, reuse),
    }

"""The CPU-lane drills of `bench drills` (see drills.py): the server SIGKILLed during a batch, and two runs of
the same partition at once. Each starts its own llama-server on a free port from an empty data folder."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, load_assets_from_modules, materialize
from pydantic import PrivateAttr

from lanes_pipeline.bench.cpu_yield import empty_data_dir, sample_days
from lanes_pipeline.bench.drills import Send, kill_counts
from lanes_pipeline.cpu_lane.assets import repo_analysis, repo_snapshot
from lanes_pipeline.cpu_lane.batching.answer_cache import CacheEntry, ResponseCache, cache_key
from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest
from lanes_pipeline.cpu_lane.batching.batch_summary import BatchProgress
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.jobs.memo import MEMO
from lanes_pipeline.cpu_lane.jobs.prompts import ASK, PromptLayout
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.partitions import daily_partitions, partitioned_daily
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.embedded.servers import EmbeddedServer, build_server
from lanes_pipeline.http import ChatOutcome, ChatRequest
from lanes_pipeline.settings import Settings, load_settings
from lanes_pipeline.store import sha256_tree

ITEMS = 50
KILLS = 3
ANSWERS_PER_RUN = 10  # new answers a run commits before its server is killed
MAX_TOKENS = 8
THINGS = ("red", "green", "blue", "yellow", "purple", "orange", "black", "white", "brown", "pink")


def kill_requests(count: int = ITEMS) -> list[BatchRequest]:
    """Short free-text questions behind one fixed prefix, each naming its number (no two alike)."""
    layout = PromptLayout(ASK, shared_context="A fault drill of the CPU lane.")
    return [
        layout.build(f"q{i:02d}", f"Name one thing that is {THINGS[i % len(THINGS)]}. ({i})", MAX_TOKENS)
        for i in range(count)
    ]


class SendLog:
    """The client's per-item record of completion requests: each one with whether the item's answer was
    already committed when it was sent (read from the cache file itself), and which were open at a kill."""

    def __init__(self, cache_path: Path, items: dict[str, tuple[str, str]]) -> None:
        self.cache_path, self.items = cache_path, items  # user turn -> (item id, cache key)
        self.sends: list[Send] = []
        self.open: set[int] = set()
        self.run = 0
        self._lock = threading.Lock()

    def _committed(self, key: str) -> bool:
        if not self.cache_path.exists():
            return False
        db = sqlite3.connect(f"file:{self.cache_path}?mode=ro", uri=True, timeout=30.0)
        try:
            return db.execute("SELECT 1 FROM responses WHERE key = ?", (key,)).fetchone() is not None
        except sqlite3.OperationalError:  # no table yet: nothing committed
            return False
        finally:
            db.close()

    def begin(self, chat: ChatRequest) -> int:
        turn = chat.messages[-1].content
        if turn not in self.items:
            raise KeyError(f"drill: a completion request for no item of the batch: {turn[:80]!r}")
        item, key = self.items[turn]
        committed = self._committed(key)
        with self._lock:
            self.sends.append(Send(item=item, run=self.run, committed_before=committed))
            self.open.add(len(self.sends) - 1)
            return len(self.sends) - 1

    def end(self, token: int, answered: bool) -> None:
        with self._lock:
            self.open.discard(token)
            self.sends[token].answered = answered

    def mark_killed(self) -> int:
        with self._lock:
            for token in self.open:
                self.sends[token].in_flight_at_kill = True
            return len(self.open)


class CountingClient(CpuClient):
    """The lane's client, counting each completion request per item in a SendLog."""

    def __init__(self, *args: Any, log: SendLog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    def chat_outcome(self, request: ChatRequest) -> ChatOutcome:
        token = self.log.begin(request)
        try:
            outcome = super().chat_outcome(request)
        except BaseException:
            self.log.end(token, answered=False)
            raise
        self.log.end(token, answered=True)
        return outcome


class CountingCpuLane(CpuLaneResource):
    """CpuLaneResource as the assets use it (cache, slot leases, progress), with the counting client."""

    _log: SendLog | None = PrivateAttr(default=None)

    def cpu_client(self) -> CpuClient:
        assert self._log is not None, "drill: set the send log before running a batch"
        return CountingClient(
            self.url,
            self.api_key(),
            timeout_s=self.config.request_timeout_s,
            connect_timeout_s=self.config.connect_timeout_s,
            retry=self.retry_policy(),
            log=self._log,
        )


def _cache_texts(path: Path, keys: dict[str, str]) -> dict[str, str]:
    """item -> committed text, read by a fresh connection (what a new process would find)."""
    with ResponseCache(path) as cache:
        entries = cache.get_many(list(keys.values()))
    return {item: entries[key].text for item, key in keys.items() if key in entries}


def _failures(result: BatchResult) -> list[str]:
    return sorted({f"{r.failure.kind}: {r.failure.reason[:160]}" for r in result.failed() if r.failure})[:5]


def server_kills(settings: Settings) -> dict[str, Any]:
    requests = kill_requests()
    with empty_data_dir(settings.data_dir) as root:
        fresh = load_settings(settings.config_dir)
        server = build_server(fresh, "cpu", port=0, publish=False)
        try:
            server.start()
            return _kill_drill(fresh, server, root, requests)
        finally:
            server.stop()


def _kill_drill(
    settings: Settings, server: EmbeddedServer, root: Path, requests: Sequence[BatchRequest]
) -> dict[str, Any]:
    cache_path = root / "cache" / "cpu_lane.sqlite3"
    # Quick retries (the configured number): after a kill the rest of a run fails fast; the re-run resumes.
    lane = settings.lanes.cpu_lane.model_copy(
        update={
            "base_url": server.url,
            "endpoints": None,
            "cache_path": str(cache_path),
            "backoff_base_s": 0.05,
            "backoff_max_s": 0.1,
        }
    )
    resource = CountingCpuLane(config=lane, bandwidth=settings.lanes.bandwidth, gpu=settings.lanes.gpu_lane)
    with CpuClient(server.url, lane.api_key()) as probe:
        fingerprint = probe.server_info(lane.model).fingerprint
    keys = {r.id: cache_key(r.chat_request(lane.model_alias), fingerprint) for r in requests}
    turns = {r.messages[-1].content: (r.id, keys[r.id]) for r in requests}
    log = SendLog(cache_path, turns)
    resource._log = log
    committed: list[dict[str, str]] = []
    runs: list[dict[str, Any]] = []
    kills = 0
    server_tokens: tuple[float, float] | None = None
    for run in range(KILLS + 1):
        log.run = run
        killed: list[int] = []
        target = len(committed[-1]) + ANSWERS_PER_RUN if committed else ANSWERS_PER_RUN

        def kill_at(
            progress: BatchProgress,
            target: int = target,
            killed: list[int] = killed,
            last: bool = run == KILLS,
        ) -> None:
            if not last and not killed and progress.done - progress.failed >= target:
                killed.append(log.mark_killed())
                server.kill()

        with CpuClient(server.url, lane.api_key()) as counters:
            before = counters.counters()
            result = resource.run_batch(requests, label=f"drill run {run}", progress=kill_at)
            if not killed:  # the server's own counters, over a run it lived through
                server_tokens = counters.counters().tokens_since(before)
        committed.append(_cache_texts(cache_path, keys))
        s = result.summary
        runs.append(
            {
                "run": run,
                "killed": bool(killed),
                "in_flight_at_kill": killed[0] if killed else 0,
                "cache_hits": s.cache_hits,
                "answered": s.answered,
                "failed": s.failed,
                "committed_after": len(committed[-1]),
                "failures": [] if killed else _failures(result),
            }
        )
        if killed:
            kills += 1
            server.start()  # same port, same weights: the same answer cache fingerprint
    counts = kill_counts([r.id for r in requests], log.sends, committed, committed[-1], kills)
    last = runs[-1]
    generated = server_tokens[1] if server_tokens else None
    return counts.model_dump() | {
        "done": f"{ITEMS}-request batch via CpuLaneResource; llama-server SIGKILLed {kills}x after "
        f"{ANSWERS_PER_RUN} new answers per run, restarted, the batch re-run each time",
        "runs": runs,
        "final_run_answered": last["answered"],
        "final_run_server_generated_tokens": generated,
        "final_run_completion_tokens": result.summary.completion_tokens,
    }


# -- two runs of one partition at once ----------------------------------------------------------------------


# The first stage of the CPU-lane assets: what two runs share (the sample repository, the answer cache, the
# memo, the artifact store) is all used here; the later stages (sampled tests in the sandbox, docs, refactors,
# the dataset) would take the two runs most of an hour on two cores.
ASSET_MODULES = (repo_snapshot, repo_analysis)


def cache_check(path: Path) -> dict[str, Any]:
    """SQLite's integrity_check of the answer cache, and every entry parsed as a CacheEntry."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        rows = db.execute("SELECT entry FROM responses").fetchall()
    finally:
        db.close()
    unreadable = 0
    for (entry,) in rows:
        try:
            CacheEntry.model_validate_json(entry)
        except ValueError:
            unreadable += 1
    return {"cache_integrity": integrity, "cache_entries": len(rows), "cache_unreadable": unreadable}


def memo_check(artifacts: Path) -> dict[str, Any]:
    """Every memo value parses as JSON; temporary files left beside them are counted."""
    files = [p for p in (artifacts / MEMO).rglob("*") if p.is_file()]
    values = [p for p in files if not p.name.startswith(".")]
    unreadable = 0
    for path in values:
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            unreadable += 1
    return {
        "memo_entries": len(values),
        "memo_unreadable": unreadable,
        "memo_temp_left": len(files) - len(values),
    }


def concurrent_runs(settings: Settings) -> dict[str, Any]:
    day = sample_days()[0]
    with empty_data_dir(settings.data_dir) as root:
        fresh = load_settings(settings.config_dir)
        server = build_server(fresh, "cpu", port=0, publish=False)
        try:
            server.start()
            outcomes = _two_runs(fresh, server.url, root, day)
        finally:
            server.stop()
        artifacts = root / "artifacts"
        on_disk = {
            name: sha256_tree(artifacts / name / day)
            for name in sorted({k for o in outcomes for k in o.get("hashes", {})})
            if (artifacts / name / day).exists()
        }
        checks = cache_check(root / "cache" / "cpu_lane.sqlite3") | memo_check(artifacts)
    both = all(o.get("success") for o in outcomes)
    first, second = (o.get("hashes", {}) for o in outcomes)
    identical = both and bool(first) and first == second == on_disk
    different = sorted(
        k for k in set(first) | set(second) if first.get(k) != second.get(k) or first.get(k) != on_disk.get(k)
    )
    answered = sum(o.get("llm_answered", 0) for o in outcomes)
    return checks | {
        # Each run asks what is not in the cache when it asks: answers both asked at once are done twice.
        "answers_done_twice": max(0, answered - checks["cache_entries"]),
        "done": f"two materialize() calls of repo_snapshot and repo_analysis for {day} at once, in two "
        "threads on one Dagster instance, one artifact store, one answer cache, one llama-server",
        "identical": identical,
        "both_succeeded": both,
        "assets_compared": len(on_disk),
        "assets_different": different,
        "runs": [{k: v for k, v in o.items() if k != "hashes"} for o in outcomes],
    }


def _two_runs(settings: Settings, url: str, root: Path, day: str) -> list[dict[str, Any]]:
    resources = {
        "cpu_lane": CpuLaneResource.from_lanes(settings.lanes, base_url=url),
        "artifact_store": ArtifactStoreResource(root=str(root / "artifacts")),
        "pipeline_settings": PipelineSettingsResource(config_dir=str(settings.config_dir)),
    }
    assets = partitioned_daily(load_assets_from_modules(list(ASSET_MODULES)), daily_partitions(settings))  # type: ignore[arg-type]
    instance = DagsterInstance.ephemeral()
    outcomes: list[dict[str, Any]] = [{}, {}]
    start = threading.Barrier(2)

    def one(index: int) -> None:
        start.wait()
        try:
            result = materialize(
                assets, resources=resources, partition_key=day, instance=instance, raise_on_error=False
            )
        except Exception as exc:  # reported as this run's outcome
            outcomes[index] = {"success": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
            return
        hashes = {
            e.asset_key.to_user_string(): e.materialization.metadata["artifact_hash"].value
            for e in result.get_asset_materialization_events()
            if "artifact_hash" in e.materialization.metadata
        }
        failed = [e.step_key for e in result.all_events if e.is_step_failure]
        usage = Counter[str]()
        for event in result.get_asset_materialization_events():
            for key, value in event.materialization.metadata.items():
                if key.endswith(("llm_requests", "llm_answered")):
                    usage[key.rsplit("/", 1)[-1]] += int(value.value)  # type: ignore[arg-type]
        outcomes[index] = {
            "success": result.success,
            "run_id": result.run_id,
            "hashes": hashes,
            "failed_steps": failed,
            **usage,
        }

    # Daemon threads: an interrupted benchmark (its server stopped) exits instead of waiting out the runs.
    threads = [threading.Thread(target=one, args=(i,), name=f"drill-run-{i}", daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes

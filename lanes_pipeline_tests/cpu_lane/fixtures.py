"""Helpers for the CPU-lane tests: batches of short questions, runner configs, private servers."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from lanes_pipeline.cpu_lane.batching.answer_cache import ResponseCache
from lanes_pipeline.cpu_lane.batching.batch import BatchResult, BatchRunner
from lanes_pipeline.cpu_lane.batching.batch_models import BatchConfig, BatchRequest
from lanes_pipeline.cpu_lane.batching.batch_summary import ProgressCallback
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.jobs.oracle_tests import VerifyPlace
from lanes_pipeline.cpu_lane.jobs.prompts import ASK, PromptLayout
from lanes_pipeline.embedded.servers import EmbeddedServer, build_server
from lanes_pipeline.git import CommitSpec, build_history, ls_tree
from lanes_pipeline.repos.snapshot import FileEntry, Snapshot, language_of
from lanes_pipeline.sandbox.isolation import detect_isolation
from lanes_pipeline.settings import RetryPolicy, SandboxLimits, Settings

COLORS = ("red", "green", "blue", "yellow", "purple", "orange", "black", "white", "brown", "pink", "gray")


def sample_snapshot(repo: Path, commit: str, previous: str | None, day: int) -> Snapshot:
    """The sample repository's snapshot at `commit` (its tests left out, as the snapshot rules leave them),
    as repo_snapshot would take it on 2026-11-<day>."""
    files = [
        FileEntry(path=e.path, blob=e.blob, language=language_of(e.path), size=e.size)
        for e in ls_tree(repo, commit)
        if not e.path.startswith("tests/")
    ]
    return Snapshot(
        repo="sample",
        day=date(2026, 11, day),
        branch="HEAD",
        commit=commit,
        previous_commit=previous,
        files=files,
        repo_map="map",
    )


def questions(count: int, max_tokens: int = 12, offset: int = 0) -> list[BatchRequest]:
    """Short free-text questions with the fixed-prefix layout: cheap, and never unparseable."""
    layout = PromptLayout(ASK, shared_context="This is a test of a batch client.")
    return [
        layout.build(
            f"q{offset + i}",
            f"Name one thing that is {COLORS[(offset + i) % len(COLORS)]}. ({offset + i})",
            max_tokens,
        )
        for i in range(count)
    ]


def batch_config(settings: Settings, **changes: Any) -> BatchConfig:
    return BatchConfig.of(settings.lanes.cpu_lane, ready_timeout_s=120.0, **changes)


def run_batch(
    url: str,
    cache_path: Path,
    config: BatchConfig,
    requests: list[BatchRequest],
    progress: ProgressCallback | None = None,
    api_key: str | None = None,
    retry: RetryPolicy | None = None,
) -> BatchResult:
    with (
        CpuClient(url, api_key, timeout_s=120.0, retry=retry, seed=0) as client,
        ResponseCache(cache_path) as cache,
    ):
        return BatchRunner(client, cache, config).run(requests, progress)


def settings_with_cpu_lane(settings: Settings, **changes: Any) -> Settings:
    lane = settings.lanes.cpu_lane.model_copy(update=changes)
    return dataclasses.replace(settings, lanes=settings.lanes.model_copy(update={"cpu_lane": lane}))


@contextmanager
def private_cpu_server(settings: Settings, start: bool = True) -> Iterator[EmbeddedServer]:
    """A server of our own on a free port, never published, always stopped (for kill/restart, API key,
    loading): the session server stays untouched for the other tests."""
    server = build_server(settings, "cpu", port=0, publish=False)
    try:
        yield server.start() if start else server
    finally:
        server.stop()


class MetricsSampler:
    """Polls /metrics in the background during a batch: the server's own view of in-flight requests."""

    def __init__(self, url: str, interval_s: float = 0.05) -> None:
        self.url, self.interval_s = url, interval_s
        self.max_processing = 0.0
        self.max_deferred = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with CpuClient(self.url, timeout_s=10.0) as client:
            while not self._stop.is_set():
                counters = client.counters()
                self.max_processing = max(self.max_processing, counters.requests_running)
                self.max_deferred = max(self.max_deferred, counters.requests_waiting or 0.0)
                self.samples += 1
                self._stop.wait(self.interval_s)

    def __enter__(self) -> MetricsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def first_done(count: int, action: Callable[[], None]) -> ProgressCallback:
    """A progress callback that runs `action` once, when `count` items are done."""
    fired = threading.Event()

    def callback(progress: Any) -> None:
        if progress.done >= count and not fired.is_set():
            fired.set()
            action()

    return callback


# A tiny repository for held-out tasks (test_holdout, test_repo_tasks, the GPU pipeline's codename day):
# three functions, a test per function and one broken on purpose (it must never judge an answer).
SHAPES_MODULE = '''"""Small helpers."""

import math


def area(r: float) -> float:
    """Area of a circle of radius r."""
    return math.pi * r * r


def double(x: int) -> int:
    """Twice x."""
    result = x + x
    return result


def shout(text: str) -> str:
    return text.upper() + "!"
'''
SHAPES_TESTS = """from shapes import area, double, shout


def test_double():
    assert double(2) == 4


def test_area_and_shout():
    assert round(area(1.0), 2) == 3.14
    assert shout("hi") == "HI!"


def test_broken_on_purpose():
    assert double(1) == 3
"""


def shapes_repo(root: Path) -> tuple[Path, str]:
    when = datetime(2026, 11, 1, 12, tzinfo=UTC)
    files = {"shapes.py": SHAPES_MODULE, "tests/test_shapes.py": SHAPES_TESTS}
    commit = build_history(root / "repo", [CommitSpec(when=when, message="shapes", files=files)])
    return root / "repo", commit


def one_commit_place(root: Path, files: dict[str, str]) -> VerifyPlace:
    """Where generated tests are judged: a repository of one commit holding `files`, one sandbox run each."""
    repo = root / "repo"
    day = CommitSpec(when=datetime(2026, 11, 3, tzinfo=UTC), message="day 3", files=files)
    return VerifyPlace(
        repo=repo,
        commit=build_history(repo, [day]),
        limits=SandboxLimits(timeout_s=30, memory_mb=768, runs=1),
        isolation=detect_isolation(),
    )

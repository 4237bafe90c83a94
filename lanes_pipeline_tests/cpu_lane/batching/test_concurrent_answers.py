"""What the fault drills' concurrent runs found, fixed: two runs of one day asking the same request at once
each committed its own answer (the last one replaced the first) and built its artifacts from it, so the two
runs wrote different artifacts. Now an answer committed after a run read the cache is kept, and that run
uses it too. Against fake servers (test_cpu_endpoints), so the two runs' requests meet for certain."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from lanes_pipeline.cpu_lane.batching.answer_cache import CacheEntry, ResponseCache
from lanes_pipeline.cpu_lane.batching.batch import BatchResult, BatchRunner
from lanes_pipeline_tests.cpu_lane.batching.test_cpu_endpoints import CONFIG, FakeServer, _endpoint, _items


class MeetingServer(FakeServer):
    """Answers a completion only once the other run's server has its request too: both asked at once."""

    def __init__(self, name: str, meeting: threading.Barrier) -> None:
        super().__init__(name)
        self.meeting = meeting

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            self.meeting.wait(timeout=30)
        return super().__call__(request)


def test_two_runs_asking_at_once_use_one_answer(tmp_path: Path) -> None:
    meeting = threading.Barrier(2)
    results: dict[str, BatchResult] = {}

    def run(name: str) -> None:
        with ResponseCache(tmp_path / "answers.sqlite3") as cache:
            endpoint = _endpoint(MeetingServer(name, meeting))
            results[name] = BatchRunner([endpoint], cache, CONFIG).run(_items(1))

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    a, b = results["a"].results[0], results["b"].results[0]
    assert not a.from_cache and not b.from_cache  # both asked the server
    with ResponseCache(tmp_path / "answers.sqlite3") as cache:
        committed = cache.get(a.key)
    assert committed is not None and a.text == b.text == committed.text
    assert committed.text in ("i0 from a", "i0 from b")


def test_an_entry_read_before_the_run_is_replaced_one_committed_since_is_kept(tmp_path: Path) -> None:
    def entry(text: str, created_at: float, read_at: float = 0.0) -> CacheEntry:
        return CacheEntry(
            key="k",
            fingerprint="f",
            item_id="i",
            text=text,
            metrics={},
            created_at=created_at,
            read_at=read_at,
        )

    with ResponseCache(tmp_path / "c.sqlite3") as cache:
        cache.put(entry("stale", created_at=10.0))
        cache.put(entry("fresh", created_at=30.0, read_at=20.0))  # the stale one was there when it read
        assert cache.get("k").text == "fresh"  # type: ignore[union-attr]
        cache.put(entry("late", created_at=40.0, read_at=25.0))  # "fresh" came after this run read
        assert cache.get("k").text == "fresh"  # type: ignore[union-attr]
        cache.put(entry("unknown", created_at=50.0))  # no read time: replaces, as before
        assert cache.get("k").text == "unknown"  # type: ignore[union-attr]

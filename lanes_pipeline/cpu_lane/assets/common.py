"""What the CPU-lane assets share: the day's repositories with their chosen symbols, asking the lane through
the memo (memo.py), reading upstream partitions with their row models (rows.py), and the lane's figures.

Deterministic failures (unparseable, too long) are remembered too; transient ones (server down) are not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import DETERMINISTIC_FAILURES, ItemResult
from lanes_pipeline.cpu_lane.jobs.day_selection import DaySelection, load_day_selection
from lanes_pipeline.cpu_lane.jobs.rows import LaneUsageFigures, RowT, read_rows
from lanes_pipeline.cpu_lane.resources import servers_metadata
from lanes_pipeline.repos.location import located_snapshots
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.settings import Settings
from lanes_pipeline.store import ArtifactStore


class DayRepo(NamedTuple):
    """A repository as the day's job sees it: its snapshot, where it is, and the day's symbols (None
    before its first commit)."""

    snapshot: Snapshot
    location: Path
    selection: DaySelection | None


def day_repos(store: ArtifactStore, day: str, settings: Settings) -> list[DayRepo]:
    """Each repository of repo_snapshot's day with the symbols day_symbols chose in it."""
    found = []
    for snapshot, location in located_snapshots(store, day, settings):
        selection = None if snapshot.commit is None else load_day_selection(store, day, snapshot, location)
        found.append(DayRepo(snapshot, location, selection))
    return found


def remembered_answer(item: ItemResult) -> dict[str, Any] | None:
    """What to remember of a free-text answer: the text, or a deterministic failure (a prompt too long
    for the context stays too long); None for a transient failure, which the next run asks again."""
    if item.status == "ok" and item.text is not None:
        return {"answer": item.text}
    if item.failure is not None and item.failure.kind in DETERMINISTIC_FAILURES:
        return {"answer": None, "reason": f"{item.failure.kind}: {item.failure.reason}"[:300]}
    return None


def is_transient(item: ItemResult) -> bool:
    """A failure the same request may not meet again (server down, timeout): never remembered."""
    if item.status == "ok":
        return False
    return item.failure is None or item.failure.kind not in DETERMINISTIC_FAILURES


def read_results(store: ArtifactStore, asset: str, day: str, model: type[RowT]) -> list[RowT]:
    """An upstream asset's `results.json`, validated with the row model its asset wrote it with."""
    if not store.exists(asset, day, "results.json"):
        raise FileNotFoundError(f"{asset} has no partition {day}: materialize it first")
    where = str(store.folder(asset, day) / "results.json")
    return read_rows(model, store.read_json(asset, day, "results.json"), where)


class LaneUsage:
    """CPU-lane figures over the batches of one materialization, as flat metadata."""

    def __init__(self) -> None:
        self.batches: list[BatchResult] = []

    def add(self, result: BatchResult) -> None:
        self.batches.append(result)

    def metadata(self, memo_hits: int) -> dict[str, Any]:
        summaries = [b.summary for b in self.batches]
        prompt = sum(s.prompt_tokens for s in summaries)
        cached = sum(s.cached_prompt_tokens for s in summaries)
        completion = sum(s.completion_tokens for s in summaries)
        wall = sum(s.wall_s for s in summaries)
        # A batch whose server cannot render prompts has no limit: count its tokens as cacheable nowhere.
        cacheable = sum(s.cacheable_prompt_tokens or 0 for s in summaries)
        return LaneUsageFigures(
            llm_requests=sum(s.requests_sent for s in summaries),
            llm_answered=sum(s.answered for s in summaries),
            cache_hits=memo_hits + sum(s.cache_hits for s in summaries),
            memo_hits=memo_hits,
            response_cache_hits=sum(s.cache_hits for s in summaries),
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
            completion_tokens=completion,
            generation_tokens_per_s=round(completion / wall, 2) if wall > 0 else 0.0,
            prompt_tokens_per_s=round((prompt - cached) / wall, 2) if wall > 0 else 0.0,
            prefix_reuse=round(cached / prompt, 4) if prompt else 0.0,
            cacheable_prompt_tokens=cacheable,
            prefix_reuse_limit=round(cacheable / prompt, 4) if prompt else 0.0,
            prefix_reuse_of_limit=round(cached / cacheable, 4) if cacheable else 0.0,
            llm_wall_s=round(wall, 3),
        ).metadata() | servers_metadata(self.batches)


def ratio(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0

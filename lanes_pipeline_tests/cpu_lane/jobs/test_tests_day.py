"""generated_tests' day on one repository, symbol by symbol, with canned answers (no model): changed symbols
first then the backlog, the selection and results remembered (a re-run of a day asks nothing), coverage."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest, ItemResult
from lanes_pipeline.cpu_lane.batching.batch_summary import summarize
from lanes_pipeline.cpu_lane.jobs.day_selection import select_day
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.cpu_lane.jobs.oracle_tests import SymbolTestResult
from lanes_pipeline.cpu_lane.jobs.tests_day import SymbolTestCoverage, SymbolTestDay, SymbolTestsConfig
from lanes_pipeline.git import build_history
from lanes_pipeline.sandbox.isolation import detect_isolation
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.cpu_lane.fixtures import sample_snapshot

# What the model "proposes" per target (after the prefilled `name(`): one good call each, so every asked
# symbol gets an accepted test; `top_words` gets a call that raises the same TypeError on every mutant.
CALLS = {
    "words": "'A b')",
    "word_count": "'one two')",
    "top_words": "1, 2, 3, 4)",
    "average_word_length": "'ab abcd')",
    "slugify": "'Hello, World!')",
    "unique_slug": "'A b', {'a-b'})",
}


class FakeLane:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, requests: Sequence[BatchRequest]) -> BatchResult:
        items = []
        for index, request in enumerate(requests):
            self.asked.append(request.id)
            name = request.id.split("::", 1)[1].split("#", 1)[0]
            items.append(
                ItemResult(index=index, id=request.id, key=str(index), status="ok", text=CALLS[name])
            )
        return BatchResult.model_construct(results=items, summary=summarize(items, 0.1), server=None)


@pytest.mark.timeout(900)
def test_a_day_takes_changed_symbols_then_the_backlog_and_a_rerun_asks_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commits = [build_history(repo, [spec]) for spec in sample_repo.history(sample_repo.FIRST_MODULES)]
    store = ArtifactStore(tmp_path / "artifacts")
    config = SymbolTestsConfig(model="m", samples=1, limits=SandboxLimits(timeout_s=30, runs=1))
    lane = FakeLane()
    register = Memo(store, "tests_register")
    day = SymbolTestDay(Memo(store, "symbol_tests"), register, config, tmp_path)
    isolation = detect_isolation()
    snaps = [sample_snapshot(repo, c, commits[i - 1] if i else None, i + 1) for i, c in enumerate(commits)]

    def run_day(index: int) -> tuple[list[SymbolTestResult], SymbolTestCoverage | None]:
        """The day's job on the symbols day_symbols would choose (2 from the backlog a day)."""
        selection = select_day(register, snaps[index], repo, 2)
        return day.run(snaps[index], repo, selection, lane, lambda: isolation)

    results, coverage = day.run(
        snaps[0], repo, select_day(register, snaps[0], repo, 2), lane, lambda: isolation
    )
    assert [r.name for r in results] == ["words", "word_count"] and all(r.accepted_tests for r in results)
    assert coverage is not None
    assert (coverage.symbols, coverage.covered, coverage.with_accepted_test, coverage.remaining) == (
        3,
        2,
        2,
        1,
    )
    assert lane.asked == ["oracle:textstats.py::words#s0", "oracle:textstats.py::word_count#s0"]

    assert day.verified == 2 and day.asked == 2
    lane.asked.clear()
    again, coverage_again = day.run(
        snaps[0], repo, select_day(register, snaps[0], repo, 2), lane, lambda: isolation
    )
    assert lane.asked == [] and again == results and coverage_again == coverage  # remembered, asked nothing
    assert day.verified == 2  # and judged nothing

    results, coverage = day.run(
        snaps[1], repo, select_day(register, snaps[1], repo, 2), lane, lambda: isolation
    )
    assert [r.name for r in results] == ["slugify", "average_word_length", "top_words"]
    # top_words(1, 2, 3, 4) only raises the TypeError of a wrong call: nothing to write a test from.
    assert [r.answers[0].status for r in results] == ["accepted", "accepted", "no_usable_result"]
    assert coverage is not None and (coverage.changed_today, coverage.backlog_today) == (2, 1)
    assert (coverage.symbols, coverage.covered, coverage.with_accepted_test) == (5, 5, 4)

    lane.asked.clear()
    results, coverage = day.run(
        snaps[2], repo, select_day(register, snaps[2], repo, 2), lane, lambda: isolation
    )
    assert lane.asked == ["oracle:slug.py::slugify#s0", "oracle:slug.py::unique_slug#s0"]
    assert coverage is not None and (coverage.symbols, coverage.with_accepted_test) == (6, 5)
    assert coverage.share() == round(5 / 6, 4)
    # A backfill of day 1 after day 3 takes day 1's symbols again, from memory.
    lane.asked.clear()
    backfill, _ = run_day(0)
    assert [r.name for r in backfill] == ["words", "word_count"] and lane.asked == []

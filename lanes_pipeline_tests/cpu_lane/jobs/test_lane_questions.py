"""`SymbolQuestions`, the CPU-lane side every per-symbol asset shares: remembered answers are not asked
again, deterministic failures are remembered, transient ones are asked again next run, and too many
transient failures fail the asset with a message that says what is kept.

SCRIPTED LANE, on purpose: a server that fails some items of a batch for transient reasons (down, 5xx) and
answers others cannot be made on demand from the real llama-server; the real path (answers, memo, re-run
with 0 requests) is test_cpu_assets.py against the embedded server."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from dagster import Failure

from lanes_pipeline.cpu_lane.assets.by_symbol import SymbolQuestions
from lanes_pipeline.cpu_lane.assets.common import remembered_answer
from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest, ItemFailure, ItemResult
from lanes_pipeline.cpu_lane.batching.batch_summary import summarize
from lanes_pipeline.cpu_lane.jobs.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.jobs.tasks import WRITE_TESTS
from lanes_pipeline.repos.symbols import Symbol, all_symbols, scan_repo
from lanes_pipeline.store import ArtifactStore

SOURCES = {
    "ok.py": "def ok():\n    return 1\n",
    "bad.py": "def bad():\n    pass\n",
    "down.py": "def down():\n    return 2\n",
}


class ScriptedLane:
    """Answers each symbol by its file: ok.py is answered, bad.py is unparseable, down.py finds the server
    down. Records which items every batch asked for."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def run_batch(self, requests: Sequence[BatchRequest]) -> BatchResult:
        self.batches.append([r.id for r in requests])
        results = [self._answer(i, r) for i, r in enumerate(requests)]
        return BatchResult.model_construct(results=results, summary=summarize(results, 1.0), server=None)

    @staticmethod
    def _answer(index: int, request: BatchRequest) -> ItemResult:
        common = {"index": index, "id": request.id, "key": request.id, "requests_sent": 1}
        if ":ok.py::" in request.id:
            return ItemResult(status="ok", text=f"answer {index}", **common)
        kind = "unparseable" if ":bad.py::" in request.id else "unreachable"
        return ItemResult(status="failed", failure=ItemFailure(kind=kind, reason=f"{kind} answer"), **common)


def symbols() -> list[Symbol]:
    return all_symbols(scan_repo(SOURCES))


def _ask(questions: SymbolQuestions, lane: ScriptedLane) -> dict[str, object]:
    chosen = symbols()
    keys = {s.id: memo_key("write_tests", s.id, s.source) for s in chosen}
    return questions.answers(
        "demo", "", chosen, keys, WRITE_TESTS, 64, shape=remembered_answer, send=lane.run_batch
    )


def test_only_missing_and_transiently_failed_answers_are_asked_again(tmp_path: Path) -> None:
    lane, memo = ScriptedLane(), Memo(ArtifactStore(tmp_path / "artifacts"), "write_tests")
    first = SymbolQuestions("generated_tests", memo)
    known = _ask(first, lane)
    assert len(lane.batches[0]) == 3
    assert known["ok.py::ok"] == {"answer": "answer 2"}  # files are scanned in path order
    assert known["bad.py::bad"] == {"answer": None, "reason": "unparseable: unparseable answer"}
    assert known["down.py::down"] is None
    assert (first.asked, len(first.failures)) == (3, 1)
    assert first.metadata()["asked_this_run"] == 3

    again = SymbolQuestions("generated_tests", memo)
    known = _ask(again, lane)
    assert lane.batches[-1] == ["demo:down.py::down"]  # the remembered two are not asked again
    assert known["bad.py::bad"]["reason"].startswith("unparseable") and known["down.py::down"] is None
    assert (again.asked, len(again.failures)) == (1, 1)


def test_too_many_transient_failures_fail_the_asset_and_say_what_is_kept(tmp_path: Path) -> None:
    questions = SymbolQuestions("generated_tests", Memo(ArtifactStore(tmp_path / "artifacts"), "write_tests"))
    _ask(questions, ScriptedLane())
    questions.check_failures(max_failure_ratio=0.5)  # 1 of 3: within the limit
    with pytest.raises(Failure, match="1 of 3 requests failed") as caught:
        questions.check_failures(max_failure_ratio=0.25)
    assert caught.value.description == (
        "generated_tests: 1 of 3 requests failed for transient reasons (> 25%); the answers so far are "
        "remembered, a re-run asks only for the rest"
    )
    # Which requests failed, and why, goes with the failure.
    metadata = caught.value.metadata or {}
    assert "cpu_lane/failures" in metadata
    assert "demo:down.py::down | unreachable | unreachable answer" in metadata["cpu_lane/failures"].value

"""`LaneQuestions`, the CPU-lane side every CPU-lane asset shares: remembered answers are not asked again,
deterministic failures are remembered, transient ones are asked again next run, and too many transient
failures fail the asset with a message that says what is kept.

SCRIPTED LANE, on purpose: a server that fails some items of a batch for transient reasons (down, 5xx) and
answers others cannot be made on demand from the real llama-server; the real path (answers, memo, re-run
with 0 requests) is test_cpu_assets.py against the embedded server."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from dagster import Failure

from lanes_pipeline.cpu_lane.assets.common import LaneQuestions, remembered_answer
from lanes_pipeline.cpu_lane.batch import BatchResult
from lanes_pipeline.cpu_lane.batch_models import BatchRequest, ItemFailure, ItemResult
from lanes_pipeline.cpu_lane.batch_summary import summarize
from lanes_pipeline.cpu_lane.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.tasks import WRITE_TESTS
from lanes_pipeline.repos.snapshot import FileEntry, Snapshot
from lanes_pipeline.settings import CpuLane
from lanes_pipeline.store import ArtifactStore

SOURCES = {"ok.py": "def ok():\n    return 1\n", "bad.py": "def bad():\n    pass\n", "down.py": "X = 1\n"}


class ScriptedLane:
    """Answers each file by its name: ok.py is answered, bad.py is unparseable, down.py finds the server
    down. Records which items every batch asked for. `config` is the lane's, as on CpuLaneResource."""

    def __init__(self, config: CpuLane | None = None) -> None:
        self.config = config or CpuLane()
        self.batches: list[list[str]] = []

    def run_batch(self, requests: Sequence[BatchRequest], log: Any = None, label: str = "") -> BatchResult:
        self.batches.append([r.id for r in requests])
        results = [self._answer(i, r) for i, r in enumerate(requests)]
        return BatchResult.model_construct(results=results, summary=summarize(results, 1.0), server=None)

    @staticmethod
    def _answer(index: int, request: BatchRequest) -> ItemResult:
        common = {"index": index, "id": request.id, "key": request.id, "requests_sent": 1}
        if request.id.endswith("ok.py"):
            return ItemResult(status="ok", text=f"answer {index}", **common)
        kind = "unparseable" if request.id.endswith("bad.py") else "unreachable"
        return ItemResult(status="failed", failure=ItemFailure(kind=kind, reason=f"{kind} answer"), **common)


@pytest.fixture
def snapshot_and_repo(tmp_path: Path) -> tuple[Snapshot, Path]:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, text in SOURCES.items():
        (repo / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    blobs = {
        name: subprocess.run(
            ["git", "-C", str(repo), "hash-object", "-w", name], check=True, capture_output=True, text=True
        ).stdout.strip()
        for name in SOURCES
    }
    files = [FileEntry(path=n, blob=b, language="python", size=len(SOURCES[n])) for n, b in blobs.items()]
    snapshot = Snapshot(repo="demo", day=date(2026, 11, 5), branch="main", commit="c0ffee", files=files)
    return snapshot, repo


def _ask(lane: LaneQuestions, snapshot: Snapshot, repo: Path) -> dict[str, Any]:
    keys = {f.path: memo_key("write_tests", f.blob) for f in snapshot.files}
    return lane.answers(
        snapshot,
        repo,
        snapshot.files,
        keys,
        WRITE_TESTS,
        64,
        prompt=lambda f, text: f"{f.path}\n{text}",
        shape=remembered_answer,
    )


def test_only_missing_and_transiently_failed_answers_are_asked_again(
    snapshot_and_repo: tuple[Snapshot, Path], tmp_path: Path
) -> None:
    snapshot, repo = snapshot_and_repo
    server, memo = ScriptedLane(), Memo(ArtifactStore(tmp_path / "artifacts"), "write_tests")
    first = LaneQuestions("generated_tests", server, memo, log=None)  # type: ignore[arg-type]
    known = _ask(first, snapshot, repo)
    assert known["ok.py"] == {"answer": "answer 0"}
    assert known["bad.py"] == {"answer": None, "reason": "unparseable: unparseable answer"}
    assert known["down.py"] is None
    assert (first.asked, first.transient) == (3, 1)
    assert first.metadata()["asked_this_run"] == 3

    again = LaneQuestions("generated_tests", server, memo, log=None)  # type: ignore[arg-type]
    known = _ask(again, snapshot, repo)
    assert server.batches[-1] == ["demo:down.py"]  # the remembered two are not asked again
    assert known["bad.py"]["reason"].startswith("unparseable") and known["down.py"] is None
    assert (again.asked, again.transient) == (1, 1)


def test_too_many_transient_failures_fail_the_asset_and_say_what_is_kept(
    snapshot_and_repo: tuple[Snapshot, Path], tmp_path: Path
) -> None:
    snapshot, repo = snapshot_and_repo
    memo = Memo(ArtifactStore(tmp_path / "artifacts"), "write_tests")
    scripted = ScriptedLane()
    lane = LaneQuestions("generated_tests", scripted, memo, log=None)  # type: ignore[arg-type]
    _ask(lane, snapshot, repo)
    # The one gate: the lane's cpu_lane.max_failure_ratio.
    scripted.config = CpuLane(max_failure_ratio=0.5)
    lane.check_failures()  # 1 of 3: within the limit
    scripted.config = CpuLane(max_failure_ratio=0.25)
    with pytest.raises(Failure, match="1 of 3 requests failed") as caught:
        lane.check_failures()
    assert caught.value.description == (
        "generated_tests: 1 of 3 requests failed for transient reasons (> 25%); the answers so far are "
        "remembered, a re-run asks only for the rest"
    )
    # Which requests failed, and why, goes with the failure (moved from the resource's removed gate).
    metadata = caught.value.metadata or {}
    assert "cpu_lane/failures" in metadata
    assert "demo:down.py | unreachable | unreachable answer" in metadata["cpu_lane/failures"].value

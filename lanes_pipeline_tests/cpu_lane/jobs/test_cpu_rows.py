"""rows.py and diff_judge.py without a sandbox: the JSON of each row keeps the shape the assets always wrote,
a row that does not fit names its file, and judging answers with no code, unparseable diffs or remembered
verdicts runs nothing. Sandbox verdicts themselves: test_sandbox.py and test_cpu_assets.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanes_pipeline.cpu_lane.jobs.diff_judge import DiffJudge
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.cpu_lane.jobs.rows import (
    AnalysisRow,
    FileAnalysisRow,
    GeneratedTestRow,
    RefactorRow,
    RememberedAnswer,
    read_rows,
)
from lanes_pipeline.cpu_lane.jobs.tasks import FileAnalysis
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline.store import ArtifactStore

ANALYSIS = FileAnalysis(summary="Adds.", public_api=["add"], risks=[], test_ideas=["1+1"], complexity="low")


def test_rows_keep_the_json_shape() -> None:
    ok = FileAnalysisRow(path="a.py", blob="b1", status="ok", analysis=ANALYSIS, accepted=True, reason="")
    bad = FileAnalysisRow(path="c.py", blob="b2", status="unparseable", reason="not JSON")
    repo = AnalysisRow(repo="r", commit=None, files=[ok, bad]).model_dump(mode="json")
    assert set(repo["files"][0]) == {"path", "blob", "status", "analysis", "accepted", "reason"}
    assert repo["files"][1] == {"path": "c.py", "blob": "b2", "status": "unparseable", "reason": "not JSON"}
    assert repo["commit"] is None  # a repository without a commit yet says so
    no_answer = GeneratedTestRow(
        repo="r", path="a.py", module="a", test_file="test_a.py", code=None, verdict="no_answer", reason="x"
    )
    assert no_answer.model_dump(mode="json") == {
        "repo": "r",
        "path": "a.py",
        "module": "a",
        "test_file": "test_a.py",
        "code": None,
        "verdict": "no_answer",
        "reason": "x",
    }
    assert RememberedAnswer(answer="text").model_dump() == {"answer": "text"}
    assert read_rows(AnalysisRow, [repo], "x.json") == [AnalysisRow.model_validate(repo)]


def test_a_row_that_does_not_fit_names_its_file() -> None:
    with pytest.raises(ValueError, match=r"results\.json: not a list of RefactorRow rows") as caught:
        read_rows(RefactorRow, [{"repo": "r", "path": "a.py", "verdict": "accepted"}], "results.json")
    assert "diff" in str(caught.value) and "reason" in str(caught.value)


def test_judging_answers_without_a_diff_runs_nothing(tmp_path: Path) -> None:
    store, limits = ArtifactStore(tmp_path / "artifacts"), SandboxLimits()
    missing = tmp_path / "no-repo"  # a sandbox here would fail: nothing below may open one
    code = "from a import add\n\n\ndef test_add():\n    assert add(1, 1) == 2\n"
    rows = [
        GeneratedTestRow(
            repo="r", path="a.py", module="a", test_file="test_a.py", code=code, verdict="passed", reason="ok"
        )
    ]
    diffs = DiffJudge(Memo(store, "diff_check"), limits).rows(
        "r",
        missing,
        "c0ffee",
        rows,
        {"a.py": RememberedAnswer(answer="I would rename add."), "b.py": None},
    )
    assert [(r.path, r.verdict, r.diff) for r in diffs] == [
        ("a.py", "not_a_diff", None),
        ("b.py", "no_answer", None),
    ]

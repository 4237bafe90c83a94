"""Accepting or rejecting a refactor diff the model proposed (generated tests have their gate in
oracle_tests.py).

Static checks first (tasks.py: diff shape), then the sandbox: a diff is accepted only if `git apply --check`
accepts it and the repository's own tests plus the accepted generated tests all pass with it applied. Every
rejection keeps its reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from lanes_pipeline.cpu_lane.jobs.tasks import ParsedDiff
from lanes_pipeline.sandbox.host_read import UnsafeResultError
from lanes_pipeline.sandbox.isolation import Isolation, open_sandbox, run_pytest
from lanes_pipeline.settings import SandboxLimits

PROPOSAL = ".lanes/proposal.diff"


DiffVerdict = Literal["accepted", "does_not_apply", "tests_failed", "baseline_failing"]


class DiffCheck(BaseModel):
    verdict: DiffVerdict
    reason: str

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"


def baseline_passes(
    repo: Path, commit: str, limits: SandboxLimits, isolation: Isolation | None = None
) -> str:
    """'' if the repository's own tests pass at `commit`, else why not (then no diff can be judged)."""
    with open_sandbox(repo, commit, limits, isolation) as sandbox:
        run = run_pytest(sandbox, ["."])
    if run.outcome in {"passed", "no_tests"}:
        return ""
    return f"{run.outcome}: {run.detail}"


def check_diff(
    repo: Path,
    commit: str,
    diff: ParsedDiff,
    accepted_tests: Mapping[str, str],
    limits: SandboxLimits,
    isolation: Isolation | None = None,
) -> DiffCheck:
    """Apply the diff in a sandbox worktree (git itself runs inside the sandbox: the diff is untrusted
    input) and run the repository's tests plus `accepted_tests` (file name -> code) once."""
    with open_sandbox(repo, commit, limits, isolation) as sandbox:
        sandbox.write(PROPOSAL, diff.text)
        check = sandbox.run(["git", "apply", "--check", "--verbose", PROPOSAL])
        if check.timed_out or check.returncode != 0:
            return DiffCheck(verdict="does_not_apply", reason=check.output.strip()[-400:] or "timed out")
        applied = sandbox.run(["git", "apply", PROPOSAL])
        if applied.returncode != 0:
            return DiffCheck(verdict="does_not_apply", reason=applied.output.strip()[-400:])
        try:  # the applied diff is the model's: a test's folder it made a link is never written through
            for name, code in sorted(accepted_tests.items()):
                sandbox.write(name, code)
        except UnsafeResultError as exc:
            return DiffCheck(verdict="does_not_apply", reason=str(exc)[:400])
        run = run_pytest(sandbox, ["."])
    if run.outcome == "passed":
        return DiffCheck(verdict="accepted", reason=f"{run.passed} tests passed with the diff applied")
    return DiffCheck(verdict="tests_failed", reason=f"{run.outcome}: {run.detail}"[:600])

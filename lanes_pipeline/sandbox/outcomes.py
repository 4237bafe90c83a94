"""Each test's outcome of one sandboxed pytest run, by node id (what held_out_tasks, the anchor set and the
body check read), told apart from a run that reported nothing."""

from __future__ import annotations

from collections.abc import Sequence

from lanes_pipeline.sandbox.isolation import Sandbox, pytest_with_report


def run_pytest_outcomes(
    sandbox: Sandbox, targets: Sequence[str], python: str | None = None
) -> dict[str, str]:
    """One pytest run of `targets` (node ids or paths): node id -> outcome of each test that ran ("passed",
    "failed", ...); empty when the run gave no report (it crashed, timed out or collected nothing). A test
    module that does not import leaves out its own tests only, never every other module's: pytest refuses
    a node id it cannot collect, and with it the whole run, so a run that reported nothing is made again on
    the files, past their collection errors, keeping the outcomes of the node ids asked for."""
    outcomes = _outcomes_of(sandbox, targets, python, ())
    if outcomes or not any("::" in t for t in targets):
        return outcomes
    files = list(dict.fromkeys(t.split("::", 1)[0] for t in targets))
    found = _outcomes_of(sandbox, files, python, ("--continue-on-collection-errors",))
    return {node: outcome for node, outcome in found.items() if _asked(node, targets)}


def _outcomes_of(
    sandbox: Sandbox, targets: Sequence[str], python: str | None, options: Sequence[str]
) -> dict[str, str]:
    _, report = pytest_with_report(sandbox, targets, 0, python, options)
    tests = (report or {}).get("tests") or {}
    return {str(node): str(outcome) for node, outcome in dict(tests).items()}


def _asked(node: str, targets: Sequence[str]) -> bool:
    """Whether a reported node id is one of `targets` (a file, a test, a class, or a parametrized test)."""
    return any(node == t or node.startswith((f"{t}::", f"{t}[")) for t in targets)

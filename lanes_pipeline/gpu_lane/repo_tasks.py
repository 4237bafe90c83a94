"""Held-out repository tasks: for each held-out function of the user's repositories (the held_out_tasks
asset's `held_out.json`), the served model gets what an editor would send when the user asks
for a body (the file's imports, what it calls, the signature and docstring) and writes the function. The
answer replaces the real function in an export of the day's commit, and the tests that call it (the
repository's own and the CPU lane's accepted ones, all passing on the real code) run in the sandbox:
`repo_pass_rate` is the share of tasks whose tests all pass.
"""

from __future__ import annotations

from lanes_pipeline.dataset.body_check import failed_tests, function_sandbox, replacement
from lanes_pipeline.dataset.contract import user_prompt
from lanes_pipeline.dataset.held_out_tasks import HeldOutDay
from lanes_pipeline.dataset.holdout_rules import HeldOutFunction, body_request
from lanes_pipeline.gpu_lane.code_tasks import CodeTask, TaskOutcome
from lanes_pipeline.sandbox.isolation import Isolation
from lanes_pipeline.settings import SandboxLimits


def task_name(function: HeldOutFunction) -> str:
    return f"{function.repo}:body:{function.symbol.id}"


def body_task(function: HeldOutFunction, system_prompt: str) -> CodeTask:
    """The request a "write_body" training row shows for the user's other functions, word for word."""
    symbol = function.symbol
    prompt = user_prompt("write_body", symbol.path, body_request(symbol), symbol.name)
    return CodeTask(name=task_name(function), system=system_prompt, prompt=prompt)


def judge_body(
    function: HeldOutFunction, answer: str, limits: SandboxLimits, isolation: Isolation | None = None
) -> TaskOutcome:
    """Passed only if every test that judges the function passes with the answer in its place."""
    name = task_name(function)
    new_source = replacement(answer, function.symbol.name)
    if new_source is None:
        return TaskOutcome(name=name, passed=False, reason=f"no parseable `def {function.symbol.name}`")
    with function_sandbox(function, limits, isolation) as tests:
        outcomes = tests.outcomes(new_source)
    failed = failed_tests(outcomes)
    if not outcomes:
        return TaskOutcome(name=name, passed=False, reason="the tests did not run (import error or timeout)")
    if failed:
        return TaskOutcome(name=name, passed=False, reason=f"{len(failed)} test(s) failed: {failed[0]}")
    return TaskOutcome(name=name, passed=True, reason=f"{len(outcomes)} test(s) passed")


def day_tasks(held: HeldOutDay | None, limit: int | None) -> list[HeldOutFunction]:
    """The day's tasks, in a fixed order (by name), the first `limit` of them."""
    functions = sorted(held.functions if held else [], key=task_name)
    return functions[:limit] if limit is not None else functions

"""Held-out repository tasks: for each held-out function of the user's repositories (the held_out_tasks
asset's `held_out.json`), the served model gets what an editor would send when the user asks
for a body (the file's imports, what it calls, the signature and docstring) and writes the function. The
answer replaces the real function in an export of the day's commit, and the tests that call it (the
repository's own and the CPU lane's accepted ones, all passing on the real code) run in the sandbox:
`repo_pass_rate` is the share of tasks whose tests all pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

from lanes_pipeline.dataset.contract import user_prompt
from lanes_pipeline.dataset.held_out_tasks import HeldOutDay, cpu_test_path
from lanes_pipeline.dataset.holdout_rules import HeldOutFunction, body_request
from lanes_pipeline.gpu_lane.code_tasks import CodeTask, TaskOutcome, extract_code
from lanes_pipeline.sandbox.isolation import Isolation, open_sandbox, run_pytest_outcomes
from lanes_pipeline.sandbox.python_source import parse_python
from lanes_pipeline.settings import SandboxLimits


def task_name(function: HeldOutFunction) -> str:
    return f"{function.repo}:body:{function.symbol.id}"


def body_task(function: HeldOutFunction, system_prompt: str) -> CodeTask:
    """The request a "write_body" training row shows for the user's other functions, word for word."""
    symbol = function.symbol
    prompt = user_prompt("write_body", symbol.path, body_request(symbol), symbol.name)
    return CodeTask(name=task_name(function), system=system_prompt, prompt=prompt)


def replacement(answer: str, name: str) -> str | None:
    """The answer's `def name` with the imports it wrote, as module-level source; None without one."""
    code = extract_code(answer)
    try:
        tree = parse_python(code)
    except SyntaxError:
        return None
    found = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name),
        None,
    )
    if found is None:
        return None
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    parts = [ast.get_source_segment(code, n, padded=False) or "" for n in [*imports, found]]
    decorators = "".join(f"@{ast.get_source_segment(code, d)}\n" for d in found.decorator_list)
    parts[-1] = decorators + parts[-1]
    return "\n".join(parts) + "\n"


def splice(module_source: str, function: HeldOutFunction, new_source: str) -> str:
    """The module with the real function (its lines, decorators included) replaced by `new_source`."""
    lines = module_source.splitlines(keepends=True)
    symbol = function.symbol
    return "".join([*lines[: symbol.start_line - 1], new_source, *lines[symbol.end_line :]])


def judge_body(
    function: HeldOutFunction, answer: str, limits: SandboxLimits, isolation: Isolation | None = None
) -> TaskOutcome:
    """Passed only if every test that judges the function passes with the answer in its place."""
    name = task_name(function)
    new_source = replacement(answer, function.symbol.name)
    if new_source is None:
        return TaskOutcome(name=name, passed=False, reason=f"no parseable `def {function.symbol.name}`")
    location = Path(function.location)
    with open_sandbox(location, function.commit, limits, isolation) as sandbox:
        module = sandbox.worktree / function.symbol.path
        sandbox.write(function.symbol.path, splice(module.read_text("utf-8"), function, new_source))
        for index, code in enumerate(function.cpu_tests):
            sandbox.write(cpu_test_path(function, index), code)
        targets = [
            *function.repo_tests,
            *(cpu_test_path(function, i) for i in range(len(function.cpu_tests))),
        ]
        outcomes = run_pytest_outcomes(sandbox, targets)
    failed = sorted(node for node, outcome in outcomes.items() if outcome != "passed")
    if not outcomes:
        return TaskOutcome(name=name, passed=False, reason="the tests did not run (import error or timeout)")
    if failed:
        return TaskOutcome(name=name, passed=False, reason=f"{len(failed)} test(s) failed: {failed[0]}")
    return TaskOutcome(name=name, passed=True, reason=f"{len(outcomes)} test(s) passed")


def day_tasks(held: HeldOutDay | None, limit: int | None) -> list[HeldOutFunction]:
    """The day's tasks, in a fixed order (by name), the first `limit` of them."""
    functions = sorted(held.functions if held else [], key=task_name)
    return functions[:limit] if limit is not None else functions

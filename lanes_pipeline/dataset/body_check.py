"""Running a function's tests with another body in its place: how both lanes decide that a "write the body"
answer is right. The GPU lane's held-out repository tasks judge the served model's answer with it
(gpu_lane/repo_tasks.py); the CPU lane's verified bodies keep only the sampled bodies it passes
(cpu_lane/jobs/verified_bodies.py). One sandbox at the day's commit serves every body tried for a function.

`extract_code`, `replacement` and `splice` are pure; `function_sandbox` runs the tests (the sandbox).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lanes_pipeline.dataset.held_out_tasks import cpu_test_path
from lanes_pipeline.dataset.holdout_rules import HeldOutFunction
from lanes_pipeline.sandbox.host_read import UnsafeResultError, read_result_text
from lanes_pipeline.sandbox.isolation import Isolation, Sandbox, open_sandbox
from lanes_pipeline.sandbox.outcomes import run_pytest_outcomes
from lanes_pipeline.sandbox.python_source import parse_python
from lanes_pipeline.settings import SandboxLimits

CODE_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(answer: str) -> str:
    """The code of an answer: its fenced blocks joined (a closing fence cut off by max_tokens is fine), or
    the whole answer when it has none."""
    blocks = [b.strip("\n") for b in CODE_BLOCK.findall(answer)]
    blocks = [b for b in blocks if b.strip()]
    return "\n\n".join(blocks) + "\n" if blocks else answer.strip("\n") + "\n"


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


class FunctionSandbox:
    """A sandbox at a function's commit with its accepted CPU-lane tests in place: runs the tests that
    judge the function with any body in its place."""

    def __init__(self, sandbox: Sandbox, function: HeldOutFunction) -> None:
        self.sandbox, self.function = sandbox, function
        # Read and written as results, never through a link (host_read): every run of `outcomes` leaves the
        # worktree the tests' to change. None: nothing can be judged (no report).
        try:
            self.module = read_result_text(sandbox.worktree, function.symbol.path)
            for index, code in enumerate(function.cpu_tests):
                sandbox.write(cpu_test_path(function, index), code)
        except UnsafeResultError:
            self.module = None
        self.targets = [
            *function.repo_tests,
            *(cpu_test_path(function, i) for i in range(len(function.cpu_tests))),
        ]

    def outcomes(self, new_source: str | None) -> dict[str, str]:
        """node id -> outcome of each judging test with `new_source` in place of the function (None: the
        real one); empty when the run gave no report (an import error, a timeout, a module that is not a
        plain file or sits under a folder an earlier run made a link)."""
        if self.module is None:
            return {}
        module = self.module if new_source is None else splice(self.module, self.function, new_source)
        try:
            self.sandbox.write(self.function.symbol.path, module)
        except UnsafeResultError:
            return {}
        return run_pytest_outcomes(self.sandbox, self.targets)


@contextmanager
def function_sandbox(
    function: HeldOutFunction, limits: SandboxLimits, isolation: Isolation | None = None
) -> Iterator[FunctionSandbox]:
    with open_sandbox(Path(function.location), function.commit, limits, isolation) as sandbox:
        yield FunctionSandbox(sandbox, function)


def failed_tests(outcomes: dict[str, str]) -> list[str]:
    return sorted(node for node, outcome in outcomes.items() if outcome != "passed")

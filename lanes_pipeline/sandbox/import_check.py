"""Whether the day's modules import in the sandbox, asked once before any answer is judged (issue 55).

A module that cannot be imported there (a dependency its files do not declare, a file the build would have
generated, code that fails at import) makes every probe and test of its symbols fail the same way: twenty
identical item failures say nothing to the user. So the modules are imported once, in one sandbox at the
day's commit with the repository's environment; a module that fails is named with the exception, the file
and line it came from and what would fix it, and its symbols are not asked that day.

The probe script and `describe` are pure; `import_problems` runs the probe.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import ValidationError

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.sandbox.host_read import UnsafeResultError, read_result_text
from lanes_pipeline.sandbox.isolation import Isolation, open_sandbox
from lanes_pipeline.settings import SandboxLimits

RESULTS_PATH = ".lanes/import_results.jsonl"
PROBE_PATH = ".lanes/import_probe.py"
PER_MODULE_S = 20  # one module that hangs at import costs this, not the others their answer
# Runs inside the sandbox with the repository's Python; the worktree is its working directory. One JSON
# line per module as soon as it is known, so a probe killed midway keeps what it learnt.
_PROBE = """\
import importlib, json, os, signal, sys, traceback

ROOT = os.getcwd()


class _Slow(BaseException):
    pass


def _alarm(signum, frame):
    raise _Slow()


signal.signal(signal.SIGALRM, _alarm)
with open(sys.argv[1], "w", encoding="utf-8") as out:
    for name in {modules}:
        row = {{"module": name}}
        signal.alarm({per_module_s})
        try:
            importlib.import_module(name)
        except _Slow:
            row.update(exception="TimeoutError", message="importing it took over {per_module_s} s")
        except BaseException as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            own = [f for f in frames if f.filename.startswith(ROOT + os.sep)] or frames[-1:]
            where = own[-1] if own else None
            row.update(
                exception=type(exc).__name__,
                message=str(exc)[:300],
                file=os.path.relpath(where.filename, ROOT) if where else "",
                line=where.lineno if where else 0,
            )
        finally:
            signal.alarm(0)
        out.write(json.dumps(row) + "\\n")
        out.flush()
"""


class ImportProblem(Frozen):
    module: str
    exception: str
    message: str
    file: str = ""
    line: int = 0

    def describe(self) -> str:
        """One line: what failed, where, and the setting that fixes it."""
        where = f" ({self.file}:{self.line})" if self.file else ""
        if self.exception == "ModuleNotFoundError":
            fix = (
                "declare what it needs in the repository's dependency files (pyproject.toml "
                "[project].dependencies, requirements*.txt), or leave the module out with `exclude:` in "
                "configs/repos.yaml"
            )
        else:
            fix = "fix the error, or leave the module out with `exclude:` in configs/repos.yaml"
        return f"`import {self.module}` fails in the sandbox: {self.exception}: {self.message}{where}; {fix}"


def probe_script(modules: Sequence[str], per_module_s: int = PER_MODULE_S) -> str:
    return _PROBE.format(modules=json.dumps(sorted(set(modules))), per_module_s=per_module_s)


def read_problems(text: str, modules: Sequence[str]) -> dict[str, ImportProblem]:
    """The probe's results by module: a line with an exception is a problem, one without imported; a module
    the probe never reported (it was killed first, or a module ended the interpreter) counts as failing."""
    reported: dict[str, ImportProblem | None] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        module = row.get("module") if isinstance(row, Mapping) else None
        if module not in modules:
            continue
        if "exception" not in row:
            reported[module] = None
            continue
        try:
            reported[module] = ImportProblem.model_validate(row)
        except ValidationError:
            reported[module] = ImportProblem(module=module, exception="ProbeFailed", message=str(row)[:300])
    reason = (
        "the import probe stopped before this module (killed, or an earlier module ended the interpreter)"
    )
    found = {m: p for m, p in reported.items() if p is not None}
    found |= {
        m: ImportProblem(module=m, exception="ProbeFailed", message=reason)
        for m in modules
        if m not in reported
    }
    return found


def import_problems(
    repo: Path,
    commit: str,
    modules: Sequence[str],
    limits: SandboxLimits,
    isolation: Isolation | None = None,
    python: str | None = None,
) -> dict[str, ImportProblem]:
    """The modules of `modules` that do not import at `commit` in the sandbox ({}: all do)."""
    if not modules:
        return {}
    with open_sandbox(repo, commit, limits, isolation) as sandbox:
        sandbox.write(PROBE_PATH, probe_script(modules))
        sandbox.run([python or sys.executable, PROBE_PATH, str(sandbox.worktree / RESULTS_PATH)])
        try:
            text = read_result_text(sandbox.worktree, RESULTS_PATH) or ""
        except UnsafeResultError as exc:
            text = "\n".join(
                json.dumps({"module": m, "exception": "ProbeFailed", "message": str(exc)[:300]})
                for m in modules
            )
    return read_problems(text, list(modules))

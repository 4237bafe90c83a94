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

RESULTS_PATH = ".lanes/import_results.json"
PROBE_PATH = ".lanes/import_probe.py"
# Runs inside the sandbox with the repository's Python; the worktree is its working directory.
_PROBE = """\
import importlib, json, os, sys, traceback

ROOT = os.getcwd()
found = {{}}
for name in {modules}:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        own = [f for f in frames if f.filename.startswith(ROOT + os.sep)] or frames[-1:]
        where = own[-1] if own else None
        found[name] = {{
            "exception": type(exc).__name__,
            "message": str(exc)[:300],
            "file": os.path.relpath(where.filename, ROOT) if where else "",
            "line": where.lineno if where else 0,
        }}
with open(sys.argv[1], "w", encoding="utf-8") as out:
    json.dump(found, out)
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


def probe_script(modules: Sequence[str]) -> str:
    return _PROBE.format(modules=json.dumps(sorted(set(modules))))


def read_problems(text: str, modules: Sequence[str]) -> dict[str, ImportProblem]:
    """The probe's results by module; a module the probe never reported (it died) counts as failing."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, Mapping):
        reason = "the import probe wrote no result (it was killed, or a module ended the interpreter)"
        return {m: ImportProblem(module=m, exception="ProbeFailed", message=reason) for m in modules}
    found = {}
    for module, entry in data.items():
        if module in modules and isinstance(entry, Mapping):
            try:
                found[module] = ImportProblem(module=module, **entry)
            except (TypeError, ValidationError):
                found[module] = ImportProblem(
                    module=module, exception="ProbeFailed", message=str(entry)[:300]
                )
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
            text = json.dumps({m: {"exception": "ProbeFailed", "message": str(exc)[:300]} for m in modules})
    return read_problems(text, list(modules))

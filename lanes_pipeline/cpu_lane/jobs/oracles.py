"""Regression oracles: the model proposes calls (the inputs), the sandbox observes what the day's commit
returns, and the observed value becomes the expected one.

A small model guesses expected values badly but proposes plausible inputs well. So its answer is read only
for calls of the target (`slugify("Hello, World!", max_length=10)`), each call is run against the real code
inside the sandbox, and a test is written from what came back: `assert slugify(...) == 'hello-worl'`, only
for results whose `repr` reads back as an equal literal, or `pytest.raises(ValueError)` for a builtin
exception. Whether such a test has teeth is decided by the mutants (mutants.py, teeth.py).

The first part is pure (parsing answers, the probe script, the test file); `observe_calls` runs the probe in
a sandbox.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.jobs.literal_size import MAX_BUILT_SIZE, built_size, large_int_argument
from lanes_pipeline.sandbox.host_read import UnsafeResultError, read_result_text
from lanes_pipeline.sandbox.isolation import (
    SETUP_FAILED,
    CommandResult,
    Isolation,
    open_sandbox,
)
from lanes_pipeline.sandbox.python_source import parse_python
from lanes_pipeline.settings import SandboxLimits

MAX_CALLS = 16
MAX_CALL_CHARS = 400
MAX_REPR_CHARS = 400
# Calls of these builtins may appear inside arguments: they build literal values and nothing else.
LITERAL_BUILDERS = frozenset({"set", "frozenset", "tuple", "list", "dict", "bytes", "range"})
PROBE_PATH = ".lanes/oracle_probe.py"
RESULTS_PATH = ".lanes/oracle_results.jsonl"


class ParsedCalls(Frozen):
    calls: list[str] = Field([], description="normalised call expressions of the target, deduplicated")
    rejected: list[str] = Field([], description="what was left out of the answer, and why")


ObservationStatus = Literal["value", "raised", "unusable"]


class Observation(Frozen):
    call: str
    status: ObservationStatus
    value_repr: str = Field("", description="repr of the result (status value)")
    exception: str = Field("", description="the exception type's name (status raised)")
    builtin_exception: bool = False
    detail: str = ""
    arcs: list[tuple[int, int]] = Field(
        [], description="(previous line, line) steps the call took through the target's module: its path"
    )


class ObservationRun(Frozen):
    observations: list[Observation]
    outcome: Literal["ok", "timeout", "crashed", "sandbox_error"]
    detail: str = ""

    @property
    def usable(self) -> list[Observation]:
        return [o for o in self.observations if usable(o)]


# ---------------------------------------------------------------------------------------------------------
# Reading the model's answer (pure)
# ---------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PROMPT = re.compile(r"^\s*(>>>|\.\.\.)\s?")


def _chunks(answer: str) -> list[str]:
    """Fenced blocks if there are any, else the whole answer; doctest prompts removed."""
    blocks = [m.group(1) for m in _FENCE.finditer(answer)] or [answer]
    return ["\n".join(_PROMPT.sub("", line) for line in block.splitlines()) for block in blocks]


def _embedded(text: str, head: str) -> list[ast.stmt]:
    """Calls written inside prose (`Try f(1) and f(2).`): the longest expression that parses, from each
    place the target's name starts."""
    found: list[ast.stmt] = []
    starts = [m.start() for m in re.finditer(rf"\b{re.escape(head)}\s*\(", text[: MAX_CALL_CHARS * 2])]
    for start in starts:
        for end in range(len(text), start, -1):
            if text[end - 1] != ")":
                continue
            try:
                found.append(parse_python(text[start:end].strip()).body[0])
                break
            except (SyntaxError, IndexError):
                continue
    return found


def _statements(chunk: str, head: str) -> list[tuple[int, ast.stmt | None, str]]:
    """(line, statement or None, text) of a chunk: parsed whole, else line by line (prose around code)."""
    try:
        return [(s.lineno, s, "") for s in _flatten(parse_python(chunk).body)]
    except SyntaxError:
        pass
    found: list[tuple[int, ast.stmt | None, str]] = []
    for number, line in enumerate(chunk.splitlines(), start=1):
        text = line.strip().rstrip(";")
        if not text or text.startswith("#"):
            continue
        try:
            found += [(number, s, "") for s in parse_python(text).body]
        except SyntaxError:
            embedded = _embedded(text, head)
            found += [(number, s, "") for s in embedded]
            if not embedded and "(" in text:
                found.append((number, None, text[:80]))
    return found


def _flatten(body: Sequence[ast.stmt]) -> list[ast.stmt]:
    """Statements inside test functions and `with` blocks too: a model often writes a whole test."""
    found: list[ast.stmt] = []
    for statement in body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.With):
            found += _flatten(statement.body)
        else:
            found.append(statement)
    return found


def _candidate(statement: ast.stmt) -> ast.expr | None:
    """The call a statement proposes: a bare call, `assert call == x` or `call == x` (left side only),
    `x = call`, `print(call)`."""
    value: ast.expr | None = None
    if isinstance(statement, ast.Expr):
        value = statement.value
        if isinstance(value, ast.Compare):  # `f(1) == 1` written without its `assert`
            value = value.left
    elif isinstance(statement, ast.Assert):
        value = statement.test
        if isinstance(value, ast.Compare):
            value = value.left
        elif isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not):
            value = value.operand
    elif isinstance(statement, ast.Assign | ast.AnnAssign):
        value = statement.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
        value = value.args[0] if len(value.args) == 1 and not value.keywords else None
    return value


def target_call(node: ast.expr, target: str) -> bool:
    """`f(...)` for target `f`; `C(...).m(...)` or `C.m(...)` for target `C.m`."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if "." not in target:
        return isinstance(func, ast.Name) and func.id == target
    owner, method = target.split(".", 1)
    if not isinstance(func, ast.Attribute) or func.attr != method:
        return False
    base = func.value
    if isinstance(base, ast.Name):
        return base.id == owner
    return isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == owner


def literal_problem(node: ast.expr) -> str | None:
    """Why an argument is not literal-ish (None: it is): constants, containers of them, signs, and
    calls of a few builtins that build values (`set()`, `range(3)`)."""
    if isinstance(node, ast.Constant):
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return literal_problem(node.operand)
    if isinstance(node, ast.BinOp):
        # Only complex literals (`1+2j`): a product could ask for gigabytes (`"a" * 10**12`).
        both = (node.left, node.right)
        numbers = all(
            isinstance(n, ast.Constant) and isinstance(n.value, int | float | complex) for n in both
        )
        return None if numbers and isinstance(node.op, ast.Add | ast.Sub) else "arithmetic in an argument"
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return next((p for p in map(literal_problem, node.elts) if p), None)
    if isinstance(node, ast.Dict):
        parts = [k for k in node.keys if k is not None] + list(node.values)
        if len(parts) != 2 * len(node.keys):
            return "`**` inside a dict"
        return next((p for p in map(literal_problem, parts) if p), None)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in LITERAL_BUILDERS:
        if node.keywords:
            return f"keywords in {node.func.id}()"
        problem = next((p for p in map(literal_problem, node.args) if p), None)
        size = None if problem else built_size(node)
        if size is not None and size > MAX_BUILT_SIZE:
            return f"{ast.unparse(node)[:40]} builds {size} items (more than {MAX_BUILT_SIZE})"
        return problem
    if isinstance(node, ast.Name):
        return f"names a variable ({node.id})"
    if isinstance(node, ast.Attribute):
        return f"attribute access ({ast.unparse(node)[:40]})"
    return f"{type(node).__name__} in an argument"


def call_problem(node: ast.Call, target: str) -> str | None:
    """Why a call of the target is not taken (None: it is)."""
    calls = [node]
    if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call):
        calls.append(node.func.value)  # `C(args).m(args)`: the constructor's arguments too
    for call in calls:
        for arg in call.args:
            if isinstance(arg, ast.Starred):
                return "starred argument"
            problem = literal_problem(arg) or large_int_argument(arg)
            if problem:
                return problem
        for keyword in call.keywords:
            if keyword.arg is None:
                return "`**` argument"
            if keyword.arg.startswith("__"):
                return f"dunder keyword {keyword.arg}"
            problem = literal_problem(keyword.value) or large_int_argument(keyword.value)
            if problem:
                return problem
    if "__" in target:
        return "dunder target"
    return None


def parse_calls(answer: str, target: str, max_calls: int = MAX_CALLS) -> ParsedCalls:
    """The calls of `target` (`f` or `Class.method`) the answer proposes, normalised by `ast.unparse`."""
    calls: list[str] = []
    rejected: list[str] = []
    for chunk in _chunks(answer):
        for line, statement, text in _statements(chunk, target.split(".", 1)[0]):
            if statement is None:
                rejected.append(f"line {line}: not Python: {text}")
                continue
            if isinstance(statement, ast.Import | ast.ImportFrom):
                continue  # the probe and the test import the target themselves
            node = _candidate(statement)
            if node is None or not target_call(node, target):
                rejected.append(f"line {line}: not a call of {target}: {ast.unparse(statement)[:80]}")
                continue
            assert isinstance(node, ast.Call)
            problem = call_problem(node, target)
            expression = ast.unparse(node)
            if problem is None and len(expression) > MAX_CALL_CHARS:
                problem = f"longer than {MAX_CALL_CHARS} characters"
            if problem is not None:
                rejected.append(f"line {line}: {problem}: {expression[:80]}")
            elif expression not in calls:
                calls.append(expression)
    if len(calls) > max_calls:
        rejected.append(f"{len(calls) - max_calls} calls over the limit of {max_calls}")
    return ParsedCalls(calls=calls[:max_calls], rejected=rejected)


# ---------------------------------------------------------------------------------------------------------
# The probe script and the test file (pure)
# ---------------------------------------------------------------------------------------------------------

# Runs inside the sandbox with the repository's Python. Results go to a file, not stdout: the code under
# test may print. A per-call alarm keeps one endless call from costing the others.
_PROBE = """\
import ast as _ast, json as _json, signal as _signal, sys as _sys

CALLS = {calls}


class _CallTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _CallTimeout()


_TARGET_FILE = getattr(_sys.modules.get({module}), "__file__", None)


# Records (previous line, line) of every frame running the target's module: the path a call took.
def _tracer(arcs):
    last = {{}}

    def local(frame, event, arg):
        if event == "line":
            key = id(frame)
            arcs.add((last.get(key, -frame.f_code.co_firstlineno), frame.f_lineno))
            last[key] = frame.f_lineno
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename == _TARGET_FILE else None

    return calls


def _observe(index, expression):
    arcs = set()
    _signal.signal(_signal.SIGALRM, _alarm)
    _signal.alarm({per_call_s})
    _sys.settrace(_tracer(arcs))
    try:
        result = eval(compile(expression, f"<call {{index}}>", "eval"), dict(vars(_sys.modules["__main__"])))
    except _CallTimeout:
        return {{"status": "unusable", "detail": "call timed out"}}
    except (Exception, SystemExit) as exc:
        _sys.settrace(None)
        kind = type(exc)
        return {{"status": "raised", "exception": kind.__name__, "arcs": sorted(arcs),
                 "builtin_exception": kind.__module__ == "builtins"}}
    finally:
        _sys.settrace(None)
        _signal.alarm(0)
    try:
        text = repr(result)
        same = len(text) <= {max_repr} and _ast.literal_eval(text) == result
        same = same and type(_ast.literal_eval(text)) is type(result)
    except Exception as exc:
        return {{"status": "unusable", "detail": f"repr does not read back: {{type(exc).__name__}}"}}
    if not same:
        return {{"status": "unusable", "detail": "repr does not read back as an equal literal"}}
    return {{"status": "value", "value_repr": text, "arcs": sorted(arcs)}}


with open(_sys.argv[1], "w", encoding="utf-8") as _out:
    for _index, _expression in enumerate(CALLS):
        _row = {{"call": _expression, **_observe(_index, _expression)}}
        _out.write(_json.dumps(_row) + "\\n")
        _out.flush()
"""


def probe_script(module: str, target: str, calls: Sequence[str], per_call_s: int = 5) -> str:
    """A script that imports the target by its real module path, evaluates each call and writes one JSON
    line per call to the file named by its first argument."""
    head = f"from {module} import {target.split('.', 1)[0]}\n"
    body = _PROBE.format(
        calls=json.dumps(list(calls)), per_call_s=per_call_s, max_repr=MAX_REPR_CHARS, module=repr(module)
    )
    return head + body


def read_observations(calls: Sequence[str], jsonl: str) -> list[Observation]:
    """One observation per call, in order; a call with no line (the probe died first) is unusable."""
    rows: dict[str, dict[str, object]] = {}
    for line in jsonl.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("call") in calls:
            rows[str(row["call"])] = row
    observations = []
    for call in calls:
        row = rows.get(call)
        if row is None:
            observations.append(Observation(call=call, status="unusable", detail="no result (probe stopped)"))
        else:
            observations.append(Observation.model_validate(row))
    return observations


def usable(observation: Observation) -> bool:
    """A value that reads back, or a builtin exception (the test can name it without importing anything)."""
    if observation.status == "value":
        return True
    return (
        observation.status == "raised"
        and observation.builtin_exception
        and is_builtin_exception(observation.exception)
    )


def _returned_arguments(observation: Observation) -> frozenset[str]:
    """Which arguments of the call the result equals (same type and value): `clamp(15, 0, 10) == 10` returns
    its third, `clamp(-3, 0, 10) == 0` its second. Behaviour a line path cannot show (`max(low, min(...))`
    is one line whichever bound wins)."""
    if observation.status != "value":
        return frozenset()
    try:
        call = parse_python(observation.call).body[0]
        result = ast.literal_eval(observation.value_repr)
    except (SyntaxError, ValueError, IndexError, TypeError, MemoryError, RecursionError):
        return frozenset()
    node = getattr(call, "value", None)
    if not isinstance(node, ast.Call):
        return frozenset()
    arguments = {str(i): a for i, a in enumerate(node.args)} | {k.arg or "**": k.value for k in node.keywords}
    found = set()
    for name, argument in arguments.items():
        with contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value = ast.literal_eval(argument)
            if type(value) is type(result) and value == result:
                found.add(name)
    return frozenset(found)


def thinned(observations: Sequence[Observation]) -> list[Observation]:
    """The observations that each show behaviour no earlier one showed: a path through the code no earlier
    call took, or on the same path a different argument returned (ten factorials of positive numbers are one
    path returning none of their arguments: the first stays). One whose path was not traced always stays."""
    seen: set[tuple[str, str, frozenset[tuple[int, int]], frozenset[str]]] = set()
    kept = []
    for observation in observations:
        path = frozenset(map(tuple, observation.arcs))
        key = (observation.status, observation.exception, path, _returned_arguments(observation))
        if observation.arcs and key in seen:
            continue
        seen.add(key)
        kept.append(observation)
    return kept


def is_builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def _test_name(target: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", target)


def oracle_test_file(module: str, target: str, observations: Sequence[Observation]) -> str:
    """The pytest module: one test per usable observation, expected values as observed."""
    kept = [o for o in observations if usable(o)]
    if not kept:
        raise ValueError(f"no usable observation of {module}.{target} to write a test from")
    raises = any(o.status == "raised" for o in kept)
    lines = [f'"""Regression tests of {module}.{target}: expected values observed at the snapshot commit."""']
    lines += ["", *(["import pytest", ""] if raises else [])]
    lines += [f"from {module} import {target.split('.', 1)[0]}", ""]
    for index, observation in enumerate(kept, start=1):
        lines += ["", f"def test_{_test_name(target)}_{index}():"]
        if observation.status == "raised":
            lines += [f"    with pytest.raises({observation.exception}):", f"        {observation.call}"]
        elif observation.value_repr in {"None", "True", "False"}:
            lines.append(f"    assert {observation.call} is {observation.value_repr}")
        else:
            lines.append(f"    assert {observation.call} == {observation.value_repr}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Observing in the sandbox (I/O)
# ---------------------------------------------------------------------------------------------------------


def observe_calls(
    repo: Path,
    commit: str,
    module: str,
    target: str,
    calls: Sequence[str],
    limits: SandboxLimits,
    isolation: Isolation | None = None,
    python: str | None = None,
) -> ObservationRun:
    """Run the calls against `commit` in a fresh sandbox; `python` is the repository's environment's
    interpreter (default: the project's own)."""
    if not calls:
        return ObservationRun(observations=[], outcome="ok", detail="no calls")
    with open_sandbox(repo, commit, limits, isolation) as sandbox:
        sandbox.write(PROBE_PATH, probe_script(module, target, calls))
        results = sandbox.worktree / RESULTS_PATH
        command = sandbox.run([python or sys.executable, PROBE_PATH, str(results)])
        try:
            jsonl = read_result_text(sandbox.worktree, RESULTS_PATH) or ""
        except UnsafeResultError as exc:  # replaced by the code under test: nothing observed
            return ObservationRun(observations=[], outcome="crashed", detail=str(exc)[:300])
    return ObservationRun(observations=read_observations(calls, jsonl), **_outcome(command))


def _outcome(command: CommandResult) -> dict[str, str]:
    if command.timed_out:
        return {"outcome": "timeout", "detail": "killed at the sandbox's time limit"}
    if command.returncode == SETUP_FAILED:
        return {"outcome": "sandbox_error", "detail": command.output[-500:]}
    if command.returncode != 0:
        return {"outcome": "crashed", "detail": f"exit {command.returncode}: {command.output[-500:]}"}
    return {"outcome": "ok", "detail": ""}

"""What may reach a user's repository on the review branch: allowlists, pure.

Whatever lands on the branch runs on the user's machine, outside any sandbox, the next time they run their
tests or doctests. The gates upstream hold a denylist (`sandbox/safety.unsafe_calls`), which passes what it
did not think of (`getattr(__builtins__, 'ev' + 'al')`, `().__class__.__base__.__subclasses__()`,
`atexit.register`, `open(path, 'w')`). Here each kind of change has the shape it may take, and anything
else is refused with the reason:

- a generated test is a regression-oracle module as `oracles.oracle_test_file` writes it: `import pytest`,
  the target imported from its module, and test functions that each assert one call of the target with
  literal arguments against a literal, or expect a builtin exception from one;
- a docstring's doctest examples are each one call of the documented symbol with literal arguments, and
  the change of its file is that docstring and nothing else;
- a refactor adds no import, no call of what reaches code or attributes by name or files
  (`FORBIDDEN_CALLS`), no dunder name or attribute, no call of a name the module did not call (or define)
  already, and no `while` loop (the one loop that needs no new call to never end);
- no change carries a secret or text addressed to a model (`sandbox/safety.py`'s detectors).
"""

from __future__ import annotations

import ast
import doctest
from collections import Counter
from collections.abc import Iterator

from lanes_pipeline.cpu_lane.jobs.docstring_edit import DocstringError, find_node
from lanes_pipeline.cpu_lane.jobs.oracles import (
    MAX_CALL_CHARS,
    call_problem,
    is_builtin_exception,
    literal_problem,
    target_call,
)
from lanes_pipeline.sandbox.python_source import parse_python
from lanes_pipeline.sandbox.safety import injection_markers, secret_findings

# Calls that reach code, names or files by a string (or stop the interpreter): a refactor adds none, even
# where the module already makes one (an `open` for reading does not vouch for one that writes).
FORBIDDEN_CALLS = frozenset(
    {
        "getattr",
        "setattr",
        "delattr",
        "hasattr",
        "vars",
        "globals",
        "locals",
        "dir",
        "eval",
        "exec",
        "compile",
        "__import__",
        "breakpoint",
        "open",
        "input",
        "exit",
        "quit",
    }
)


# ---------------------------------------------------------------------------------------------------------
# Generated tests: the regression-oracle shape
# ---------------------------------------------------------------------------------------------------------


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _oracle_statement_problem(statement: ast.stmt, target: str) -> str | None:
    """Why one statement of a test function is not an oracle (None: it is)."""
    if isinstance(statement, ast.Assert) and statement.msg is None:
        test = statement.test
        if not (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq | ast.Is)
            and target_call(test.left, target)
        ):
            return f"not `assert {target}(...) == <literal>`"
        assert isinstance(test.left, ast.Call)
        return call_problem(test.left, target) or literal_problem(test.comparators[0])
    if isinstance(statement, ast.With) and len(statement.items) == 1 and len(statement.body) == 1:
        item, body = statement.items[0], statement.body[0]
        raises = item.context_expr
        if not (
            item.optional_vars is None
            and isinstance(raises, ast.Call)
            and ast.unparse(raises.func) == "pytest.raises"
            and not raises.keywords
            and len(raises.args) == 1
            and isinstance(raises.args[0], ast.Name)
            and is_builtin_exception(raises.args[0].id)
        ):
            return "a `with` that is not `pytest.raises(<builtin exception>)`"
        if not (isinstance(body, ast.Expr) and target_call(body.value, target)):
            return f"not a call of {target} inside pytest.raises"
        assert isinstance(body.value, ast.Call)
        return call_problem(body.value, target)
    return f"{type(statement).__name__} is not an oracle"


def oracle_test_problem(code: str, module: str, target: str) -> str | None:
    """Why a test module is not a regression oracle of `target` (`f` or `C.m`) of `module` (None: it is)."""
    try:
        tree = parse_python(code)
    except SyntaxError as exc:
        return f"does not parse: line {exc.lineno}: {exc.msg}"
    body = tree.body[1:] if tree.body and _is_docstring(tree.body[0]) else tree.body
    allowed_imports = {"import pytest", f"from {module} import {target.split('.', 1)[0]}"}
    tests = 0
    for node in body:
        where = f"line {node.lineno}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            if ast.unparse(node) not in allowed_imports:
                return f"{where}: imports {ast.unparse(node)[:80]}"
            continue
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
            return f"{where}: {type(node).__name__} outside a test function"
        arguments = node.args
        if (
            node.decorator_list
            or node.returns is not None
            or arguments.args
            or arguments.posonlyargs
            or arguments.kwonlyargs
            or arguments.vararg
            or arguments.kwarg
        ):
            return f"{where}: {node.name} has decorators, parameters or annotations"
        if len(node.body) != 1:
            return f"{where}: {node.name} is not one oracle"
        problem = _oracle_statement_problem(node.body[0], target)
        if problem is not None:
            return f"line {node.body[0].lineno}: {problem}"
        tests += 1
    return None if tests else "no test function"


# ---------------------------------------------------------------------------------------------------------
# Docstrings: examples that call the symbol, and a change that is only the docstring
# ---------------------------------------------------------------------------------------------------------


def example_problem(source: str, target: str) -> str | None:
    """Why one doctest example is not a call of `target` with literal arguments (None: it is)."""
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        return f"not Python ({exc.msg})"
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return "not a single expression"
    node = tree.body[0].value
    if not target_call(node, target):
        return f"not a call of {target}"
    assert isinstance(node, ast.Call)
    if len(ast.unparse(node)) > MAX_CALL_CHARS:
        return f"longer than {MAX_CALL_CHARS} characters"
    return call_problem(node, target)


def example_problems(docstring: str, target: str) -> list[str]:
    """What in a docstring's `>>>` examples is not a call of `target` with literal arguments (empty: all
    are; a docstring without an example has a problem: the gate accepts none)."""
    try:
        examples = doctest.DocTestParser().get_examples(docstring, target)
    except ValueError as exc:
        return [f"doctest cannot read the examples: {exc}"[:300]]
    if not examples:
        return ["no `>>>` example"]
    found = []
    for number, example in enumerate(examples, start=1):
        problem = example_problem(example.source, target)
        if problem is not None:
            found.append(f"example {number} ({example.source.strip()[:60]!r}): {problem}")
    return found


def _without_docstring(tree: ast.Module, target: str) -> str:
    """The module's syntax tree with `target`'s docstring taken out, as text (positions left out)."""
    node = find_node(tree, target)
    if node.body and _is_docstring(node.body[0]):
        node.body = node.body[1:]
    return ast.dump(tree)


def docstring_change_problem(before: str, after: str, target: str, docstring: str) -> str | None:
    """Why `after` is more than `before` with `target`'s docstring made `docstring` (None: it is not)."""
    try:
        new = parse_python(after)
    except SyntaxError as exc:
        return f"does not parse after the change: line {exc.lineno}: {exc.msg}"
    try:
        old = parse_python(before)
        placed = ast.get_docstring(find_node(new, target))
        if placed != docstring:
            return f"the docstring of {target} after the change is not the one the gate accepted"
        if _without_docstring(old, target) != _without_docstring(new, target):
            return f"changes more than the docstring of {target}"
    except (SyntaxError, DocstringError) as exc:
        return f"{target} cannot be compared before and after: {exc}"
    return None


# ---------------------------------------------------------------------------------------------------------
# Refactors: nothing the module did not already do
# ---------------------------------------------------------------------------------------------------------


def call_name(func: ast.expr) -> str:
    """How a call is named: `f`, `os.path.join`; `<Call>.index` for a method of a value that is not a
    name (`sorted(x).index(1)`), `<Lambda>` for a lambda called where it is written."""
    parts: list[str] = []
    node = func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    head = node.id if isinstance(node, ast.Name) else f"<{type(node).__name__}>"
    return ".".join([head, *reversed(parts)])


def _called(tree: ast.AST) -> Iterator[str]:
    """Every name the module calls, counting what Python calls for it: decorators (`@atexit.register`
    calls `atexit.register`), class bases and metaclasses."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield call_name(node.func)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for decorator in node.decorator_list:
                yield "<Call>" if isinstance(decorator, ast.Call) else call_name(decorator)
        if isinstance(node, ast.ClassDef):
            yield from (call_name(base) for base in node.bases)
            yield from (call_name(keyword.value) for keyword in node.keywords)


def _defined(tree: ast.AST) -> set[str]:
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def _imports(tree: ast.AST) -> Iterator[str]:
    yield from (ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _dunders(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_dunder(node.attr):
            yield f".{node.attr}"
        elif isinstance(node, ast.Name) and _is_dunder(node.id):
            yield node.id


def _whiles(tree: ast.AST) -> int:
    return sum(isinstance(node, ast.While) for node in ast.walk(tree))


def _forbidden(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and call_name(node.func).rsplit(".", 1)[-1] in FORBIDDEN_CALLS:
            yield call_name(node.func)


def diff_problems(before: str, after: str) -> list[str]:
    """What a change of a module adds that a refactor may not (empty: nothing): each kind counted, so a
    second `open()` in a module that had one is found."""
    try:
        new = parse_python(after)
    except SyntaxError as exc:
        return [f"does not parse after the diff: line {exc.lineno}: {exc.msg}"]
    try:
        old: ast.AST = parse_python(before)
    except SyntaxError:
        old = ast.Module(body=[], type_ignores=[])
    added_imports = Counter(_imports(new)) - Counter(_imports(old))
    forbidden = Counter(_forbidden(new)) - Counter(_forbidden(old))
    dunders = Counter(_dunders(new)) - Counter(_dunders(old))
    loops = _whiles(new) - _whiles(old)
    known = set(_called(old)) | _defined(new)
    new_calls = {name for name in _called(new) if name not in known and name not in forbidden}
    problems = [f"adds an import: {name}" for name in sorted(added_imports)]
    problems += [f"adds a call of {name}() (code, attributes or files by name)" for name in sorted(forbidden)]
    problems += [f"adds dunder access: {name}" for name in sorted(dunders)]
    problems += [f"calls {name}, which the module did not call before" for name in sorted(new_calls)]
    problems += [f"adds {loops} `while` loop(s)"] if loops > 0 else []
    return problems


# ---------------------------------------------------------------------------------------------------------
# What no change may carry
# ---------------------------------------------------------------------------------------------------------


def carried_problem(text: str) -> str | None:
    """Why text added to a repository may not go there (None: it may): a secret, or a phrase that tries
    to steer a model (the next model to read the repository would read it)."""
    secrets = secret_findings(text)
    if secrets:
        return f"holds what looks like a secret ({', '.join(secrets)})"
    markers = injection_markers(text)
    if markers:
        return f"holds text addressed to a model ({markers[0]!r})"
    return None

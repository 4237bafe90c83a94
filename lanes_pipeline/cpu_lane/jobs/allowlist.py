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
- a refactor changes only its symbol, and its new lines load only allowed values (value_allowlist.py: a
  rule over what a name holds, not over what a call is named);
- every file is written as UTF-8 and read back by Python as the text judged here
  (`python_source.python_file_bytes`: no other encoding declaration);
- no change carries a secret or text addressed to a model (`sandbox/safety.py`'s detectors), and neither
  does a commit's message.
"""

from __future__ import annotations

import ast
import doctest

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

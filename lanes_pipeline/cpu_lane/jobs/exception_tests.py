"""Whether a generated test's expected exception is one its target raises on purpose (issue 54). Pure.

`pytest.raises(TypeError)` around `median(3)` passes, and kills both body mutants (any exception does), yet
a reviewer deletes it: the TypeError comes from a wrong-type call, not from anything `median` decides. An
exception test is kept only when its exception (or a subclass of it) is raised by a `raise` statement of the
target or of a function of its module the target calls (docstring_facts.reached_definitions); what an
operation raises on its own (a subscript's KeyError, a division's ZeroDivisionError) does not count. The
`remove_raises` mutant (mutants.py) then proves it: with those `raise` statements made `pass`, the test must
fail.
"""

from __future__ import annotations

import ast

from lanes_pipeline.cpu_lane.jobs.docstring_edit import DocstringError, find_node
from lanes_pipeline.cpu_lane.jobs.docstring_facts import ANY_EXCEPTION, exception_ancestors, raisable
from lanes_pipeline.sandbox.python_source import parse_python

UNINTENDED = "unintended_exception"
REMOVE_RAISES_SURVIVED = "survives the remove_raises mutant"
# What an accepted test passed, in the order the gate checks it (checks_of_test).
BASE_TEST_CHECKS = (
    "policy",
    "passes at the commit",
    "fails on raise_not_implemented",
    "fails on return_none",
)
EXCEPTION_TEST_CHECKS = ("exception raised on purpose", "fails on remove_raises")


def deliberate_raises(source: str, target: str) -> set[str]:
    """The exceptions `target` (`f`, `C`, `C.m`) of the module `source` raises with a `raise` statement, its
    own or a same-module callee's, with every class each derives from (ANY_EXCEPTION: one it cannot name)."""
    tree = parse_python(source)
    try:
        node = find_node(tree, target)
    except DocstringError:
        return set()
    raised = raisable(tree, node, deliberate=True)
    return set().union(*(exception_ancestors(name, tree) for name in raised)) if raised else set()


def raised_on_purpose(source: str, target: str, exception: str) -> bool:
    """Whether a test expecting `exception` from `target` tests a decision of the code."""
    return among_deliberate(deliberate_raises(source, target), exception)


def among_deliberate(raised: set[str], exception: str) -> bool:
    """Whether `exception` is among what a target raises on purpose (`deliberate_raises`), read once for
    every call of an answer."""
    return exception in raised or ANY_EXCEPTION in raised


def expected_exceptions(test_code: str) -> list[str]:
    """The exception names a test module expects, from each `pytest.raises(X)` / `raises((X, Y))`, in order
    (a name it cannot read, a variable say, as ANY_EXCEPTION)."""
    try:
        tree = parse_python(test_code)
    except SyntaxError:
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name != "raises":
            continue
        first = node.args[0]
        for expr in first.elts if isinstance(first, ast.Tuple) else [first]:
            leaf = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")
            found.append(leaf or ANY_EXCEPTION)
    return list(dict.fromkeys(found))


def unintended_exception_problem(test_code: str, source: str, target: str) -> str | None:
    """Why the test expects an exception `target` does not raise on purpose (None: every expected one is)."""
    raised = deliberate_raises(source, target)
    if ANY_EXCEPTION in raised:
        return None
    for name in expected_exceptions(test_code):
        if name not in raised:
            return (
                f"expects {name} but {target} never raises it (no `raise` of it in its body or a function "
                "of its module it calls): a test of a wrong call, not of the code"
            )
    return None


def checks_of_test(code: str) -> list[str]:
    """The checks an accepted test module has passed (a test expecting an exception meets two more)."""
    return [*BASE_TEST_CHECKS, *(EXCEPTION_TEST_CHECKS if expected_exceptions(code) else ())]

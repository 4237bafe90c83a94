"""Mutants of one target: the module's source with the target's body replaced, everything else byte-identical.

A generated test is worth keeping only if it fails on broken code. Two mutants per target:
- `raise NotImplementedError`: kills tests that never really call the target;
- `return None`: kills tests that only check truthiness or that it "does not raise".
A test that expects an exception meets a third, `remove_raises`: every `raise` statement of the target and
of the functions of its module it calls made `pass` (the guard removed), so it passes only if the exception
came from the code's own decision (exception_tests.py).

The body is cut out by the parser's line/column offsets (ast's end_lineno/end_col_offset; columns are UTF-8
byte offsets), never by `ast.unparse` of the whole file: comments, formatting and every other line stay
exactly as committed, so the mutant differs from the original only inside the target. The docstring and the
decorators stay. A class target mutates each of its public methods (all at once, one mutant per kind; a class
with none, its dunder methods); a `Class.method` target mutates that method. Pure.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.jobs.docstring_facts import reached_definitions
from lanes_pipeline.sandbox.python_source import parse_python

MutantKind = Literal["raise_not_implemented", "return_none", "remove_raises"]
BodyMutantKind = Literal["raise_not_implemented", "return_none"]
REPLACEMENTS: dict[BodyMutantKind, str] = {
    "raise_not_implemented": "raise NotImplementedError",
    "return_none": "return None",
}
_Function = ast.FunctionDef | ast.AsyncFunctionDef


class Mutant(Frozen):
    target: str
    kind: MutantKind
    methods: list[str]  # the functions whose bodies were replaced (qualified names)
    source: str


class MutationError(ValueError):
    pass


def _find(tree: ast.Module, target: str) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef:
    parts = target.split(".")
    if len(parts) > 2 or not all(parts):
        raise MutationError(f"target {target!r}: expected `function`, `Class` or `Class.method`")
    scope: Sequence[ast.stmt] = tree.body
    node: ast.stmt | None = None
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        node = next((n for n in reversed(scope) if isinstance(n, kinds) and n.name == part), None)
        if node is None:
            raise MutationError(f"target {target!r}: no {part!r} defined at that level")
        scope = node.body  # type: ignore[union-attr]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    return node


def _functions(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, target: str) -> list[_Function]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return [node]
    functions = [m for m in node.body if isinstance(m, _Function)]
    methods = [m for m in functions if not m.name.startswith("_")]
    # A class used only through its dunders (a context manager, a container) is broken through those.
    methods = methods or [m for m in functions if m.name.startswith("__") and m.name.endswith("__")]
    if not methods:
        raise MutationError(f"class {target!r} has no method to mutate")
    return methods


def _has_docstring(function: _Function) -> bool:
    first = function.body[0]
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )


def _char_col(line: bytes, byte_col: int) -> int:
    return len(line[:byte_col].decode("utf-8"))


class _Edit(BaseModel):
    start: tuple[int, int]  # (0-based line, character column)
    end: tuple[int, int]
    text: str


def _body_edit(function: _Function, lines: Sequence[str], statement: str) -> _Edit:
    """Replace every statement after the docstring (or insert one after a lone docstring)."""
    encoded = [line.encode("utf-8") for line in lines]

    def position(lineno: int, byte_col: int) -> tuple[int, int]:
        return lineno - 1, _char_col(encoded[lineno - 1], byte_col)

    body = function.body[1:] if _has_docstring(function) else function.body
    if body:
        first, last = body[0], body[-1]
        assert last.end_lineno is not None and last.end_col_offset is not None
        # A decorated nested def starts at its first decorator's line; its `@` sits at the def's indentation.
        decorators = getattr(first, "decorator_list", [])
        line = decorators[0].lineno if decorators else first.lineno
        return _Edit(
            start=position(line, first.col_offset),
            end=position(last.end_lineno, last.end_col_offset),
            text=statement,
        )
    docstring = function.body[0]
    assert docstring.end_lineno is not None and docstring.end_col_offset is not None
    end = position(docstring.end_lineno, docstring.end_col_offset)
    if docstring.lineno == function.lineno:  # `def f(): "doc"` on one line
        return _Edit(start=end, end=end, text=f"; {statement}")
    indent = lines[docstring.lineno - 1][: _char_col(encoded[docstring.lineno - 1], docstring.col_offset)]
    return _Edit(start=end, end=end, text=f"\n{indent}{statement}")


def _apply(lines: Sequence[str], edits: Sequence[_Edit]) -> str:
    text = list(lines)
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):  # back to front: offsets stay valid
        (l1, c1), (l2, c2) = edit.start, edit.end
        head, tail = text[l1][:c1], text[l2][c2:]
        text[l1 : l2 + 1] = [head + edit.text + tail]
    return "".join(text)


def mutate(source: str, target: str, kind: BodyMutantKind) -> Mutant:
    """One mutant of `target` (`function`, `Class` or `Class.method`) in the module `source`."""
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        raise MutationError(f"the module does not parse: line {exc.lineno}: {exc.msg}") from exc
    node = _find(tree, target)
    functions = _functions(node, target)
    lines = source.splitlines(keepends=True)
    edits = [_body_edit(f, lines, REPLACEMENTS[kind]) for f in functions]
    mutated = _apply(lines, edits)
    try:
        parse_python(mutated)
    except SyntaxError as exc:  # a bug here, never the repository's fault: say exactly where
        raise MutationError(f"mutant {kind} of {target!r} does not parse: line {exc.lineno}") from exc
    prefix = f"{target}." if isinstance(node, ast.ClassDef) else ""
    names = [f"{prefix}{f.name}" if prefix else target for f in functions]
    return Mutant(target=target, kind=kind, methods=names, source=mutated)


def mutants(source: str, target: str) -> list[Mutant]:
    """Both mutants of `target`: `raise NotImplementedError`, then `return None`."""
    return [mutate(source, target, kind) for kind in REPLACEMENTS]


def _own_raises(function: ast.AST) -> list[ast.Raise]:
    """The `raise` statements that run when `function` does (not those of nested functions or classes)."""
    found: list[ast.Raise] = []
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Raise):
            found.append(node)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))
    return found


def remove_raises(source: str, target: str) -> Mutant:
    """`target` with every `raise` statement it runs made `pass`: its own and those of the functions of its
    module it calls (docstring_facts.reached_definitions). MutationError when there is none to remove."""
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        raise MutationError(f"the module does not parse: line {exc.lineno}: {exc.msg}") from exc
    node = _find(tree, target)
    lines = source.splitlines(keepends=True)
    encoded = [line.encode("utf-8") for line in lines]
    edits: list[_Edit] = []
    edited: list[str] = []
    for definition in reached_definitions(tree, node):
        raises = _own_raises(definition)
        edited += [definition.name] if raises else []
        for statement in raises:
            assert statement.end_lineno is not None and statement.end_col_offset is not None
            start = (statement.lineno - 1, _char_col(encoded[statement.lineno - 1], statement.col_offset))
            end_line = statement.end_lineno - 1
            end = (end_line, _char_col(encoded[end_line], statement.end_col_offset))
            edits.append(_Edit(start=start, end=end, text="pass"))
    if not edits:
        raise MutationError(f"{target!r} has no `raise` statement to remove")
    mutated = _apply(lines, edits)
    try:
        parse_python(mutated)
    except SyntaxError as exc:
        raise MutationError(f"mutant remove_raises of {target!r} does not parse: line {exc.lineno}") from exc
    return Mutant(target=target, kind="remove_raises", methods=edited, source=mutated)

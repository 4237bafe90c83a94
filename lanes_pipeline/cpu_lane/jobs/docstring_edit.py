"""Writing a docstring into a symbol's source, and the diff of the file: only the docstring's lines change,
every other line stays as committed. Pure."""

from __future__ import annotations

import ast
import difflib
import inspect
from collections.abc import Sequence

from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.repos.symbols import Symbol, statement_start, unindent
from lanes_pipeline.sandbox.python_source import parse_python


class DocstringError(ValueError):
    pass


class Documented(Frozen):
    """A docstring placed in its symbol: the literal as written, its value, the new file and the diff."""

    docstring: str = Field(description="the docstring's value, cleaned as `inspect.cleandoc` does")
    literal: str = Field(description="the docstring literal as inserted, without indentation")
    file_source: str = Field(description="the symbol's file with the docstring in place")
    symbol_source: str = Field(description="the symbol's lines in that file, dedented")
    diff: str = Field(description="unified diff of the file (a/ b/ paths), hunks inside the symbol")


# A function, a class, or a method of one.
Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def find_node(tree: ast.Module, name: str) -> Definition:
    """The definition of `f`, `C` or `C.m` at module level (the last one, as Python binds it)."""
    scope: Sequence[ast.stmt] = tree.body
    node: Definition | None = None
    parts = name.split(".")
    for depth, part in enumerate(parts):
        kinds = Definition if depth == len(parts) - 1 else ast.ClassDef
        node = next((n for n in reversed(scope) if isinstance(n, kinds) and n.name == part), None)
        if node is None:
            raise DocstringError(f"{name!r}: no {part!r} defined at that level")
        scope = node.body
    assert node is not None
    return node


def _has_docstring(node: Definition) -> bool:
    first = node.body[0]
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )


def set_docstring(source: str, name: str, literal: str | None) -> str:
    """`source` with the docstring of `name` (`f`, `C`, `C.m`) replaced by `literal` (added when it has
    none; removed when `literal` is None). Only the docstring's lines change."""
    tree = parse_python(source)
    node = find_node(tree, name)
    lines = source.splitlines(keepends=True)
    first = node.body[0]
    first_line = statement_start(first)  # a decorated nested definition starts at its first decorator
    before_body = lines[first_line - 1].encode("utf-8")[: first.col_offset].decode("utf-8", "ignore")
    if before_body.strip():  # `def f(x): return x`: no line of its own to put a docstring above
        raise DocstringError(f"{name}: its body starts on the `def`/`class` line")
    if _has_docstring(node):
        end_line = first.end_lineno or first.lineno
        if len(node.body) > 1 and node.body[1].lineno == end_line:
            raise DocstringError(f"{name}: another statement shares the docstring's line")
        start, end = first.lineno - 1, end_line
    else:
        start = end = first_line - 1
    text = lines[first_line - 1]
    indent = text[: len(text) - len(text.lstrip())]
    if literal is None:
        # A body that was only its docstring keeps a statement, so the code still parses.
        new: list[str] = [f"{indent}pass\n"] if _has_docstring(node) and len(node.body) == 1 else []
    else:
        new = [f"{indent}{line}\n" if line else "\n" for line in literal.split("\n")]
    if end == len(lines) and lines and not lines[-1].endswith("\n") and new:
        new[-1] = new[-1].removesuffix("\n")
    return "".join([*lines[:start], *new, *lines[end:]])


def unified_diff(path: str, before: str, after: str) -> str:
    """A diff `git apply` takes: a/ b/ paths, and the marker for a last line without a newline."""
    out = []
    for line in difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    ):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def document(symbol: Symbol, file_source: str, literal: str) -> Documented:
    """The docstring written into the symbol's file, checked by reading it back with Python."""
    new_source = set_docstring(file_source, symbol.name, literal)
    node = find_node(parse_python(new_source, filename=symbol.path), symbol.name)
    value = ast.get_docstring(node)
    expected = inspect.cleandoc(ast.literal_eval(literal))
    if value != expected:
        raise DocstringError(f"{symbol.name}: the docstring does not read back as written")
    delta = len(new_source.splitlines()) - len(file_source.splitlines())
    lines = new_source.splitlines(keepends=True)
    start = find_node(parse_python(file_source), symbol.name)
    first = min([start.lineno, *(d.lineno for d in start.decorator_list)])
    last = (start.end_lineno or start.lineno) + delta
    own = unindent("".join(lines[first - 1 : last]))[1]
    return Documented(
        docstring=expected,
        literal=literal,
        file_source=new_source,
        symbol_source=own.rstrip("\n") + "\n",
        diff=unified_diff(symbol.path, file_source, new_source),
    )

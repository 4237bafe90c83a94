"""Held-out code completion points: where an editor would ask the served model to continue a file.

Each held-out top-level function is cut at line boundaries inside its body (after the signature and the
docstring); the line after the cut is what the model should write next, scored by exact match and edit
similarity as CrossCodeEval and RepoBench do (gpu_lane/completion.py). A line that is blank or only closing
brackets and punctuation (`)`, `])`, `}:`) is no point: predicting it says nothing about the model, and it
would only inflate the exact-match rate. Everything here is pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.repos.scan import body_statements
from lanes_pipeline.repos.symbols import ParsedSymbol, Symbol, parse_symbol, statement_start

# A line of nothing but closing brackets and punctuation (or nothing at all): not a completion point.
_NO_POINT = re.compile(r"[\s)\]},:;.]*")


class CompletionPoint(BaseModel):
    """One cut in a held-out function: the file's text before `line` is the prompt, `expected` the answer."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="`{repo}:complete:{symbol id}:{line}`, stable while the file is unchanged")
    repo: str
    path: str
    symbol: str = Field(description="the held-out function's id (`path::name`)")
    line: int = Field(ge=1, description="1-based line number in the file of the line to predict")
    expected: str = Field(description="that line's text, as in the file (indentation included)")


def point_id(repo: str, symbol_id: str, line: int) -> str:
    return f"{repo}:complete:{symbol_id}:{line}"


def is_point_line(text: str) -> bool:
    """Whether a line is worth predicting: not blank, not only closing brackets and punctuation."""
    return _NO_POINT.fullmatch(text) is None


def _matches_file(symbol: Symbol, file_lines: list[str]) -> bool:
    """Whether the symbol's lines are the file's lines where it says they are (a symbol from another
    version of the file would cut the wrong lines)."""
    own = symbol.source.splitlines()
    if symbol.start_line < 1 or symbol.end_line - symbol.start_line + 1 != len(own):
        return False
    return file_lines[symbol.start_line - 1 : symbol.end_line] == own


def _first_body_line(parsed: ParsedSymbol) -> int | None:
    """The line (1-based within the symbol) where the points start: after the docstring when there is one,
    else the first statement with the comments right above it (a comment is body a reader writes too);
    None for a function with no body beyond its docstring."""
    node, lines = parsed.node, parsed.source.splitlines()
    body = body_statements(node)
    if not body:
        return None
    if len(body) < len(node.body):  # a docstring: what follows it is body, comments included
        return (node.body[0].end_lineno or node.body[0].lineno) + 1
    first = statement_start(body[0])
    if lines[first - 1].encode("utf-8")[: body[0].col_offset].strip():
        return first + 1  # the body shares its first line with the signature (`def f(x): return x`)
    while first - 1 > node.lineno and lines[first - 2].strip()[:1] in {"", "#"}:
        first -= 1
    return first


def cut_points(repo: str, path: str, source: str, symbol: Symbol) -> list[CompletionPoint]:
    """The completion points of one top-level function in its file's text `source`: every line of its
    body after the signature and the docstring that is worth predicting (`is_point_line`), in line order.
    A function whose lines do not match `source` gives none; a body that starts on the signature's or the
    docstring's line (`def f(x): return x`) starts its points on the next line."""
    if symbol.kind != "function":
        raise ValueError(f"{repo}: {symbol.id} is a {symbol.kind}: completion points cut top-level functions")
    if symbol.path != path:
        raise ValueError(f"{repo}: {symbol.id} is in {symbol.path}, not in {path}")
    file_lines = source.splitlines()
    if not _matches_file(symbol, file_lines):
        return []
    first = _first_body_line(parse_symbol(symbol))
    if first is None:
        return []
    points = []
    for offset in range(first - 1, symbol.end_line - symbol.start_line + 1):
        line = symbol.start_line + offset
        text = file_lines[line - 1]
        if is_point_line(text):
            points.append(
                CompletionPoint(
                    id=point_id(repo, symbol.id, line),
                    repo=repo,
                    path=path,
                    symbol=symbol.id,
                    line=line,
                    expected=text,
                )
            )
    return points


def day_points(
    repo: str, held: Iterable[Symbol], sources: Mapping[str, str]
) -> tuple[list[CompletionPoint], dict[str, str]]:
    """One repository's points of the day and the texts of the files that hold one (path -> text).

    `held`: the held-out symbols (all kinds: only the top-level functions are cut); `sources`: path -> the
    file's text at the day's commit. The points come by function id, then line, so the same day always
    asks the same points in the same order. A function whose file is not in `sources` gives none.
    """
    functions = sorted((s for s in held if s.kind == "function"), key=lambda s: s.id)
    points = [
        point
        for symbol in functions
        if symbol.path in sources
        for point in cut_points(repo, symbol.path, sources[symbol.path], symbol)
    ]
    return points, {path: sources[path] for path in sorted({p.path for p in points})}

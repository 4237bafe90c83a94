"""A repository's symbols at a commit, and what a symbol's own lines give every stage.

`symbols_at` reads the chosen Python files at a commit (git objects, no checkout) and scans them symbol by
symbol (symbols.py): files that do not parse are left out with their reason, and so is a symbol the
pipeline cannot handle (`skipped`, `symbol_problem`), so the day goes on without it; the repository's own
test files are read beside them, for references (the backlog's order) and for the example a prompt shows.
`body_text`, `function_stub` and `leaked`'s normalization read a symbol's lines the same way for the
leak check, the mask and the body request.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.git import ls_tree, read_blobs
from lanes_pipeline.repos.snapshot import is_test_path
from lanes_pipeline.repos.symbols import (
    Symbol,
    all_symbols,
    definition,
    parse_symbol,
    reference_counts,
    scan_repo,
    statement_start,
    stub,
)


def function_stub(symbol: Symbol) -> str:
    """A function's signature and docstring (the body left out)."""
    node = definition(symbol)
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        raise ValueError(f"{symbol.id}: a {symbol.kind}, not a function: it has no body to ask for")
    return stub(node, symbol.module).split("\n", 1)[1]  # without the `# module` line


def symbol_problem(symbol: Symbol) -> str | None:
    """Why the pipeline cannot handle `symbol` (None: it can). Every stage reads a symbol's own lines through
    the same pure functions (its definition, its body as the leak check and the mask see it, the stub a body
    request shows); running them once when the repository is read lets a symbol that one of them fails on be
    skipped, with this reason, before any work is spent on it, instead of failing the day in a later step."""
    try:
        body_text(symbol)
        if symbol.kind == "function":
            function_stub(symbol)
    except Exception as exc:  # whatever it is, it is this symbol's: named, and the day goes on
        return f"{type(exc).__name__}: {exc}"
    return None


def normalized_lines(text: str) -> list[str]:
    """Lines stripped of indentation and diff markers, blanks dropped: a body reads the same in a file, in
    a code block and in a unified diff."""
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped[:1] in {"+", "-"} and not stripped.startswith(("+=", "-=", "--", "++")):
            stripped = stripped[1:].strip()
        if stripped:
            lines.append(stripped)
    return lines


def body_statements(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> list[ast.stmt]:
    """The statements after the docstring."""
    return node.body[1:] if ast.get_docstring(node) is not None else node.body


def body_text(symbol: Symbol) -> str:
    """The code after the signature and docstring (what writing the body means), normalized."""
    parsed = parse_symbol(symbol)
    body = body_statements(parsed.node)
    if not body:
        return ""
    start = statement_start(body[0])
    lines = parsed.source.splitlines()[start - 1 :]
    # A body that shares a line with the signature or the docstring starts at its column.
    lines[0] = lines[0].encode("utf-8")[body[0].col_offset :].decode("utf-8", "ignore")
    return "\n".join(normalized_lines("\n".join(lines)))


class SymbolsAt(Frozen):
    commit: str
    symbols: list[Symbol] = Field([], description="of the chosen (non-test) files, by path then line")
    left_out: dict[str, str] = Field({}, description="path -> why the file was not scanned")
    test_sources: dict[str, str] = Field({}, description="the repository's own test files, path -> source")
    references: dict[str, int] = Field({}, description="symbol id -> references anywhere, tests included")
    skipped: dict[str, str] = Field(
        {}, description="symbol id -> why the pipeline cannot handle it (symbol_problem): not in `symbols`"
    )

    def by_id(self) -> dict[str, Symbol]:
        return {s.id: s for s in self.symbols}


def symbols_at(repo: Path, commit: str, paths: Collection[str] | None = None) -> SymbolsAt:
    """The symbols of `paths` (default: every non-test `.py` file) at `commit`, and its test files."""
    entries = [e for e in ls_tree(repo, commit) if e.path.endswith(".py")]
    chosen = [e for e in entries if (e.path in paths if paths is not None else not is_test_path(e.path))]
    tests = [e for e in entries if is_test_path(e.path)]
    blobs = read_blobs(repo, [e.blob for e in [*chosen, *tests]])
    sources, left_out = {}, {}
    for entry in chosen:
        try:
            sources[entry.path] = blobs[entry.blob].decode("utf-8")
        except UnicodeDecodeError as exc:
            left_out[entry.path] = f"not UTF-8: {exc.reason} at byte {exc.start}"
    test_sources = {}
    for entry in tests:
        try:
            test_sources[entry.path] = blobs[entry.blob].decode("utf-8")
        except UnicodeDecodeError:
            continue  # a test file we cannot read is no example and no reference: nothing lost
    scans = scan_repo(sources)
    left_out |= {scan.path: scan.error for scan in scans if scan.error is not None}
    scanned = all_symbols(scans)
    skipped = {s.id: problem for s in scanned if (problem := symbol_problem(s)) is not None}
    symbols = [s for s in scanned if s.id not in skipped]
    references = reference_counts({**sources, **test_sources}, symbols)
    return SymbolsAt(
        commit=commit,
        symbols=symbols,
        left_out=left_out,
        test_sources=test_sources,
        references=references,
        skipped=skipped,
    )

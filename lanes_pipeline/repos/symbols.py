"""Python symbols as the CPU lane's unit of work: each top-level function and class with the context it needs.

A file of any size is covered symbol by symbol; only a file Python cannot parse is left out (with the
SyntaxError's line). Methods stay with their class; a class longer than `max_class_lines` is split into one
item per method, each keeping the class header. A symbol's context is what a reader needs besides its own
lines: the module's imports, the enclosing class header, and the signatures and docstrings of what it calls
that the repository defines (same module always; other modules when a `RepoSymbols` index is given).

`memo_key` hashes the source plus that context, so editing one function of a big module changes only that
function's key (and the keys of the symbols that show its signature). Everything here is pure.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.repos.snapshot import module_name
from lanes_pipeline.sandbox.python_source import parse_python

SymbolKind = Literal["function", "class", "method"]
MAX_CALLEES = 8  # a symbol's context shows at most this many callee stubs (first called first)
MAX_STUB_DOC = 400  # characters of a callee's docstring shown in the context

_Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


class Symbol(Frozen):
    """One item of work: a function, a whole class, or one method of a class too large to take whole."""

    kind: SymbolKind
    name: str = Field(description="qualified within the module: `f`, `C`, `C.m`")
    path: str
    module: str = Field(description="import path: `pkg/mod.py` -> `pkg.mod`, `src/` layout stripped")
    start_line: int = Field(description="first line, decorators included (1-based)")
    end_line: int = Field(description="last line (inclusive)")
    source: str
    imports: list[str] = Field([], description="the module's import statements, as written")
    class_header: str = Field("", description="for a method: decorators, `class` line, docstring, attributes")
    callees: list[str] = Field([], description="signature + docstring of each repository symbol it calls")
    memo_key: str

    @property
    def id(self) -> str:
        """Stable across days while the symbol keeps its file and name (its memo key changes with edits)."""
        return f"{self.path}::{self.name}"

    @property
    def import_name(self) -> str:
        """What a test imports from `module` to reach it: the class for a method."""
        return self.name.split(".", 1)[0]

    def context_text(self) -> str:
        """The context as prompt text, in a fixed order (imports, callees, class header)."""
        parts = []
        if self.imports:
            parts.append("\n".join(self.imports))
        if self.callees:
            parts.append("# Defined elsewhere in the repository:\n" + "\n\n".join(self.callees))
        if self.class_header:
            parts.append(self.class_header)
        return "\n\n".join(parts)


class SymbolSourceError(ValueError):
    """A symbol's own source does not parse as its definition (names the symbol and its lines)."""


@dataclass(frozen=True)
class ParsedSymbol:
    """A symbol's definition as parsed from its own lines (see `parse_symbol`). `node`'s line numbers count
    from the symbol's first line (1), its columns from `indent`: the symbol's indentation in its file (a
    method's), removed from every line of `source`."""

    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    indent: str
    source: str

    def file_column(self, lineno: int, byte_col: int) -> int:
        """The character column in the file of `byte_col` (ast's UTF-8 offset) on the node's line `lineno`."""
        line = self.source.splitlines()[lineno - 1]
        return len(self.indent) + len(line.encode("utf-8")[:byte_col].decode("utf-8", "ignore"))


def unindent(code: str) -> tuple[str, str]:
    """(the first line's indentation, `code` with it removed from each line that starts with it)."""
    lines = code.splitlines(keepends=True)
    first = next((line for line in lines if line.strip()), "")
    indent = first[: len(first) - len(first.lstrip())]
    return indent, "".join(line[len(indent) :] if line.startswith(indent) else line for line in lines)


def parse_symbol(symbol: Symbol) -> ParsedSymbol:
    """The symbol's definition, parsed from its own lines: the one way every pure function reads a symbol.

    A method (or any definition not at column 0) is indented in its file. `textwrap.dedent` cannot be
    trusted with that: a line of a string literal written at column 0 leaves nothing in common to remove.
    `unindent` removes the definition's own indentation (its first line's) from each line that starts with
    it; a line that does not is blank or inside a string or a bracket, where indentation means nothing.
    """
    indent, source = unindent(symbol.source)
    try:
        tree = parse_python(source, filename=symbol.path)
    except (SyntaxError, ValueError) as exc:
        where = f" line {exc.lineno}" if isinstance(exc, SyntaxError) else ""
        raise SymbolSourceError(
            f"{symbol.id} (lines {symbol.start_line}-{symbol.end_line}): its source does not parse{where}: "
            f"{getattr(exc, 'msg', exc)}"
        ) from exc
    node = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(node, _Def) or node.name != symbol.name.rsplit(".", 1)[-1]:
        raise SymbolSourceError(
            f"{symbol.id} (lines {symbol.start_line}-{symbol.end_line}): its source is not one definition "
            f"of {symbol.name.rsplit('.', 1)[-1]!r}"
        )
    return ParsedSymbol(node=node, indent=indent, source=source)


def definition(symbol: Symbol) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef:
    """The symbol's definition node (see `parse_symbol`)."""
    return parse_symbol(symbol).node


class SymbolScan(Frozen):
    """The symbols of one file, or why it was left out."""

    path: str
    module: str
    symbols: list[Symbol] = Field(default_factory=list)
    error: str | None = Field(None, description="why the file could not be parsed (None: it was)")


class RepoSymbols(Frozen):
    """What every module of the repository defines at top level, as stubs: `module -> name -> stub`."""

    stubs: dict[str, dict[str, str]] = Field(default_factory=dict)

    def stub(self, module: str, name: str) -> str | None:
        return self.stubs.get(module, {}).get(name)


class SymbolDiff(Frozen):
    """Symbol ids between two scans of a repository."""

    new: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    unchanged: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------
# Stubs and source segments
# ---------------------------------------------------------------------------------------------------------


def _lines(source: str) -> list[str]:
    return source.splitlines(keepends=True)


def statement_start(node: ast.stmt) -> int:
    """A statement's first line: a decorated definition starts at its first decorator."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


def _segment(lines: Sequence[str], first: int, last: int) -> str:
    return "".join(lines[first - 1 : last]).rstrip("\n") + "\n"


def _signature_line(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{prefix} {node.name}({ast.unparse(node.args)}){returns}:"


def _class_line(node: ast.ClassDef) -> str:
    bases = [ast.unparse(b) for b in node.bases] + [ast.unparse(k) for k in node.keywords]
    return f"class {node.name}({', '.join(bases)}):" if bases else f"class {node.name}:"


def _doc_lines(node: _Def, indent: str) -> list[str]:
    doc = ast.get_docstring(node)
    if not doc:
        return []
    if len(doc) > MAX_STUB_DOC:
        doc = doc[:MAX_STUB_DOC].rstrip() + " ..."
    body = doc.replace('"""', r"\"\"\"").splitlines() or [""]
    body[0] = f'"""{body[0]}'
    body[-1] = f'{body[-1]}"""'
    return [f"{indent}{line}" if line else "" for line in body]


def stub(node: _Def, module: str) -> str:
    """`# module` then the signature and docstring of a function or class (a class lists its methods)."""
    if isinstance(node, ast.ClassDef):
        lines = [_class_line(node), *_doc_lines(node, "    ")]
        lines += [
            f"    {_signature_line(item)} ..."
            for item in node.body
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            and (not item.name.startswith("_") or item.name == "__init__")
        ]
    else:
        lines = [_signature_line(node), *_doc_lines(node, "    ")]
    if len(lines) == 1:
        lines[0] += " ..."
    return f"# {module}\n" + "\n".join(lines)


def _class_header(node: ast.ClassDef, lines: Sequence[str]) -> str:
    """A class's decorators, `class` line, docstring and class-level statements (not its methods)."""
    header_end = max(node.body[0].lineno - 1, node.lineno)
    text = _segment(lines, statement_start(node), header_end)
    members = [
        _segment(lines, item.lineno, item.end_lineno or item.lineno)
        for item in node.body
        if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.lineno > header_end
    ]
    return (text + "".join(members)).rstrip("\n")


def _import_lines(tree: ast.Module, lines: Sequence[str]) -> list[str]:
    """Import statements at module level, including those inside top-level `try`/`if` blocks."""
    found: list[str] = []

    def visit(body: Iterable[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(_segment(lines, node.lineno, node.end_lineno or node.lineno).strip())
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)

    visit(tree.body)
    return found


# ---------------------------------------------------------------------------------------------------------
# Resolving what a symbol calls
# ---------------------------------------------------------------------------------------------------------


def _resolve_from(module: str, path: str, node: ast.ImportFrom) -> str:
    """The absolute module of `from ... import` (relative imports resolved against the file's package)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
    return ".".join([*base, *([node.module] if node.module else [])])


def _import_map(
    tree: ast.Module, module: str, path: str
) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """(name -> (module, name) from `from x import`, alias -> module from `import x`)."""
    names: dict[str, tuple[str, str]] = {}
    modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve_from(module, path, node)
            for alias in node.names:
                names[alias.asname or alias.name] = (source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    modules[alias.name.split(".")[0]] = alias.name.split(".")[0]
    return names, modules


def _called(node: ast.AST) -> list[ast.expr]:
    """The callee expressions of every call inside `node`, in source order, first occurrence only."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    return [c.func for c in calls]


class _Resolver:
    def __init__(self, tree: ast.Module, module: str, path: str, repo: RepoSymbols | None) -> None:
        self.module, self.repo = module, repo
        self.local = {n.name: n for n in tree.body if isinstance(n, _Def)}
        self.names, self.modules = _import_map(tree, module, path)

    def stubs(self, node: _Def, enclosing: ast.ClassDef | None) -> list[str]:
        found: list[str] = []
        for func in _called(node):
            text = self._resolve(func, node, enclosing)
            if text is not None and text not in found:
                found.append(text)
            if len(found) >= MAX_CALLEES:
                break
        return found

    def _resolve(self, func: ast.expr, node: _Def, enclosing: ast.ClassDef | None) -> str | None:
        if isinstance(func, ast.Name):
            target = self.local.get(func.id)
            if target is not None:
                return None if target is node else stub(target, self.module)
            if func.id in self.names and self.repo is not None:
                return self.repo.stub(*self.names[func.id])
            return None
        if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
            return None
        owner = func.value.id
        if owner in {"self", "cls"} and enclosing is not None:
            method = next(
                (
                    m
                    for m in enclosing.body
                    if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
                    and m.name == func.attr
                    and m is not node
                ),
                None,
            )
            return stub(method, f"{self.module}.{enclosing.name}") if method is not None else None
        if owner in self.modules and self.repo is not None:
            return self.repo.stub(self.modules[owner], func.attr)
        if owner in self.names and self.repo is not None:  # `from pkg import mod` then `mod.f()`
            source, name = self.names[owner]
            return self.repo.stub(f"{source}.{name}", func.attr)
        return None


# ---------------------------------------------------------------------------------------------------------
# Scans
# ---------------------------------------------------------------------------------------------------------


def test_functions(path: str, source: str) -> list[tuple[str, ast.FunctionDef]]:
    """The top-level `test*` functions of a test file, with its path; none if it does not parse."""
    try:
        tree = parse_python(source, filename=path)
    except (SyntaxError, ValueError):
        return []
    return [(path, n) for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]


def names_in(node: ast.AST) -> set[str]:
    """Every name and attribute a piece of code mentions (how a test is seen to call a symbol)."""
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
    return found


def memo_key(kind: str, module: str, name: str, source: str, context: Sequence[str]) -> str:
    payload = json.dumps([kind, module, name, source, list(context)], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


def parse_error(path: str, source: str) -> str | None:
    """Why Python cannot parse the file (None: it can)."""
    try:
        parse_python(source, filename=path)
    except SyntaxError as exc:
        return f"SyntaxError line {exc.lineno}: {exc.msg}"
    except ValueError as exc:  # e.g. NUL bytes
        return f"ValueError: {exc}"
    return None


def extract_symbols(
    path: str, source: str, repo: RepoSymbols | None = None, max_class_lines: int = 120
) -> SymbolScan:
    """Every top-level function and class of a module as symbols, in source order."""
    module = module_name(path)
    error = parse_error(path, source)
    if error is not None:
        return SymbolScan(path=path, module=module, error=error)
    tree = parse_python(source, filename=path)
    lines = _lines(source)
    imports = _import_lines(tree, lines)
    resolver = _Resolver(tree, module, path, repo)
    symbols: list[Symbol] = []

    def add(kind: SymbolKind, name: str, node: _Def, header: str, enclosing: ast.ClassDef | None) -> None:
        first, last = statement_start(node), node.end_lineno or node.lineno
        text = _segment(lines, first, last)
        callees = resolver.stubs(node, enclosing)
        key = memo_key(kind, module, name, text, [*imports, header, *callees])
        symbols.append(
            Symbol(
                kind=kind,
                name=name,
                path=path,
                module=module,
                start_line=first,
                end_line=last,
                source=text,
                imports=imports,
                class_header=header,
                callees=callees,
                memo_key=key,
            )
        )

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            add("function", node.name, node, "", None)
        elif isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
            size = (node.end_lineno or node.lineno) - statement_start(node) + 1
            if size <= max_class_lines or not methods:
                add("class", node.name, node, "", None)
                continue
            header = _class_header(node, lines)
            for method in methods:
                add("method", f"{node.name}.{method.name}", method, header, node)
    return SymbolScan(path=path, module=module, symbols=symbols)


def index_repo(sources: Mapping[str, str]) -> RepoSymbols:
    """Stubs of every top-level function and class of every parseable module (`path -> source`)."""
    stubs: dict[str, dict[str, str]] = {}
    for path, source in sorted(sources.items()):
        if parse_error(path, source) is not None:
            continue
        module = module_name(path)
        tree = parse_python(source, filename=path)
        stubs[module] = {n.name: stub(n, module) for n in tree.body if isinstance(n, _Def)}
    return RepoSymbols(stubs=stubs)


def scan_repo(sources: Mapping[str, str], max_class_lines: int = 120) -> list[SymbolScan]:
    """Scans of every file (`path -> source`), sorted by path, with cross-module callee stubs."""
    repo = index_repo(sources)
    return [extract_symbols(p, s, repo, max_class_lines) for p, s in sorted(sources.items())]


def all_symbols(scans: Iterable[SymbolScan]) -> list[Symbol]:
    return [symbol for scan in scans for symbol in scan.symbols]


def diff_scans(before: Iterable[Symbol], after: Iterable[Symbol]) -> SymbolDiff:
    """Which symbols are new, changed (memo key differs), removed or unchanged, by id, sorted."""
    old = {s.id: s.memo_key for s in before}
    new = {s.id: s.memo_key for s in after}
    return SymbolDiff(
        new=sorted(i for i in new if i not in old),
        changed=sorted(i for i in new if i in old and old[i] != new[i]),
        removed=sorted(i for i in old if i not in new),
        unchanged=sorted(i for i in new if i in old and old[i] == new[i]),
    )


def reference_counts(sources: Mapping[str, str], symbols: Iterable[Symbol]) -> dict[str, int]:
    """How often each symbol's (last) name is referenced anywhere in the repository, tests included:
    names read (`f`, `C`) and attributes (`obj.m`, `mod.f`); definitions themselves do not count."""
    seen: Counter[str] = Counter()
    for path, source in sources.items():
        if parse_error(path, source) is not None:
            continue
        for node in ast.walk(parse_python(source, filename=path)):
            if isinstance(node, ast.Name):
                seen[node.id] += 1
            elif isinstance(node, ast.Attribute):
                seen[node.attr] += 1
            elif isinstance(node, ast.alias):
                seen[node.name.rsplit(".", 1)[-1]] += 1
    return {s.id: seen[s.name.rsplit(".", 1)[-1]] for s in symbols}

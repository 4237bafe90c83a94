"""Whether a proposed docstring states facts the code it describes bears out (issue 54). Pure.

Doctest examples that pass prove the examples, not the prose: a model's docstring can document a parameter the
function does not have, list exceptions it never raises, promise a value a procedure never returns, or say
nothing but the name. These checks read the docstring's sections with `docstring_parser` (Google, NumPy and
reST styles; the style that reads the most sections wins, as its AUTO mode decides) and hold each against the
symbol's syntax tree in its module:

- `parameters`: every documented parameter is in the signature (a class's: its `__init__`'s, or a
  dataclass's fields), none is documented twice, and where an Args/Parameters section exists every
  parameter (but `self`/`cls`) is in it.
- `raises`: every `Raises` entry names an exception the body can raise: `raise X` / `raise X(...)`, a bare
  `raise` inside `except X`, an `assert` (AssertionError), or any of these in a function or method of the same
  module it calls (transitively; calls are read by name: `f(...)`, `self.m(...)`, `cls.m(...)`, `C(...)`).
  A documented base class of a raised exception counts (LookupError for a raised KeyError). Lenient where
  the code hides what it raises: a bare `raise` outside a typed handler, or `raise err` of a variable, accepts
  any entry. Exceptions from builtins only where the operation provably raises them on some value: `next`
  (StopIteration), `int`/`float`/`complex`/`.index`/`.remove` (ValueError), a subscript but a slice
  (KeyError, IndexError), `/`, `//`, `%` by a non-literal (ZeroDivisionError), `getattr` without a
  default (AttributeError), `open` (OSError). Never TypeError: a wrong-type call is not what a function
  raises on purpose (issue 54).
- `returns`: a `Returns` section (not `Yields`) is refused on a function whose body returns no value (only
  bare `return`, `return None` or none; generators, stubs and abstract methods excepted) or annotated
  `-> None`, and when the section's type and the annotation are both simple names that differ. A section
  that says just `None` is no claim of a value.
- `summary`: the summary line exists and says more than the name (`is_power_of_two.`, `Is power of two`,
  `Return the gcd.`: words compared lower-cased, with a few filler words left out).

`replaced_docstring_problem` is the rule that an existing docstring is never replaced: a proposal must keep
it verbatim as its start, and only what it adds is judged (a problem the author's text has is theirs).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
from collections.abc import Iterator

import docstring_parser
from docstring_parser import google, numpydoc, rest
from docstring_parser.common import Docstring, DocstringParam, DocstringRaises, DocstringReturns, ParseError

from lanes_pipeline.cpu_lane.jobs.docstring_edit import Definition, DocstringError, find_node
from lanes_pipeline.sandbox.python_source import parse_python

# The checks of this module, in the order they run, as an accepted row lists them (GeneratedDocRow.checks).
FACT_CHECKS = ("summary", "parameters", "raises", "returns")
EXCLUDED_PARAMETERS = frozenset({"self", "cls"})
# Google sections the parser does not know by default, read as parameters (a keyword-only parameter is
# documented there as often as under Args).
_EXTRA_PARAMETER_SECTIONS = ("Keyword Args", "Keyword Arguments", "Kwargs", "Other Parameters")
_FILLER = frozenset({"a", "an", "the", "this", "function", "method", "class", "return", "returns", "def"})
_SYNONYMS = {"boolean": "bool", "integer": "int", "string": "str", "dictionary": "dict", "none": "None"}
# What a builtin operation raises on some value (see the module's docstring).
_CALL_RAISES = {
    "next": ("StopIteration",),
    "int": ("ValueError",),
    "float": ("ValueError",),
    "complex": ("ValueError",),
    "index": ("ValueError",),
    "remove": ("ValueError",),
    "getattr": ("AttributeError",),
    "open": ("OSError",),
}
ANY_EXCEPTION = "*"  # the code raises something this reading cannot name: any entry is accepted


# ---------------------------------------------------------------------------------------------------------
# Reading the docstring
# ---------------------------------------------------------------------------------------------------------


def _google_parser() -> google.GoogleParser:
    extra = [google.Section(t, "param", google.SectionType.MULTIPLE) for t in _EXTRA_PARAMETER_SECTIONS]
    return google.GoogleParser(sections=[*google.DEFAULT_SECTIONS, *extra])


def _colon_entries(text: str) -> str:
    """`text` with a colon after each Google section entry that lacks one (`Raises:` then `TypeError,
    ValueError`, as issue 54's answer wrote it): the parser refuses the whole docstring without it."""
    titles = {s.title for s in google.DEFAULT_SECTIONS} | set(_EXTRA_PARAMETER_SECTIONS)
    lines, entry_indent = text.splitlines(), None
    for index, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if line.strip().rstrip(":") in titles and line.rstrip().endswith(":"):
            entry_indent = -1  # the next indented line sets the entries' indentation
            continue
        if entry_indent is None or not line.strip():
            continue
        if entry_indent == -1:
            entry_indent = indent
        if indent < entry_indent or indent == 0:
            entry_indent = None
        elif indent == entry_indent and ":" not in line:
            lines[index] = line.rstrip() + ":"
    return "\n".join(lines)


def read_sections(docstring: str) -> Docstring:
    """The docstring read in the style that finds the most sections (a style that cannot read it is left
    out; none: the text as its description, no sections)."""
    text = inspect.cleandoc(docstring)
    found: list[Docstring] = []
    google_parse = _google_parser().parse
    attempts = [(google_parse, text), (google_parse, _colon_entries(text))]
    attempts += [(numpydoc.parse, text), (rest.parse, text)]
    for parse, written in attempts:
        try:
            found.append(parse(written))
        except (ParseError, ValueError, IndexError):
            continue
    if not found:
        return docstring_parser.Docstring()
    return max(found, key=lambda d: len(d.meta))


def documents_parameters(docstring: str) -> bool:
    """Whether the docstring has a parameter section in any style (`Args:`, `Parameters` + dashes,
    `:param x:`): an extension then opens no `Args:` of its own."""
    return bool(read_sections(docstring).params)


def _names(text: str | None) -> list[str]:
    """The identifiers of a section entry's name (`x, y`, `*args`, `pkg.KeyError or ValueError`)."""
    if not text:
        return []
    found = []
    for part in re.split(r"[,|]|\bor\b|\s+", text):
        part = part.strip().lstrip("*").rsplit(".", 1)[-1].strip("`'\"()[]:")
        if part.isidentifier():
            found.append(part)
    return found


# ---------------------------------------------------------------------------------------------------------
# Reading the code
# ---------------------------------------------------------------------------------------------------------


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node of a definition's body but those of nested functions, lambdas and classes (their code
    does not run when the definition does)."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        yield child
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(child))


def _is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")) == "dataclass":
            return True
    return False


def _init(node: ast.ClassDef) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    return next(
        (
            n
            for n in node.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__"
        ),
        None,
    )


def signature_parameters(node: Definition) -> list[str] | None:
    """The parameters a docstring documents (`self`/`cls` excluded); None when not known from the code (a
    class that inherits its `__init__`)."""
    if isinstance(node, ast.ClassDef):
        init = _init(node)
        if init is None:
            if not _is_dataclass(node):
                return None
            return [
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]
        node = init
    args = node.args
    names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [n for n in names if n not in EXCLUDED_PARAMETERS]


def _exception_name(expr: ast.expr) -> str:
    """`X`, `X(...)`, `mod.X(...)` -> `X`; a variable (`raise err`) -> ANY_EXCEPTION."""
    target = expr.func if isinstance(expr, ast.Call) else expr
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    if name and (name[0].isupper() or name.endswith(("Error", "Exception", "Warning", "Exit", "Interrupt"))):
        return name
    return ANY_EXCEPTION


def _handler_types(handler: ast.ExceptHandler) -> list[str]:
    if handler.type is None:
        return [ANY_EXCEPTION]
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    names = [_exception_name(t) for t in types]
    # A bare `raise` under `except Exception` re-raises whatever came: nothing this reading can name.
    return [ANY_EXCEPTION if n in ("Exception", "BaseException") else n for n in names]


def _direct_raises(node: Definition, deliberate: bool = False) -> set[str]:
    """What the definition's own body raises (see the module's docstring); `deliberate`: only its `raise`
    statements, none of what an operation or an `assert` raises on its own."""
    found: set[str] = set()

    def visit(child: ast.AST, handler: list[str] | None) -> None:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return
        if isinstance(child, ast.ExceptHandler):
            handler = _handler_types(child)
        if isinstance(child, ast.Raise):
            found.update(
                [_exception_name(child.exc)] if child.exc is not None else (handler or [ANY_EXCEPTION])
            )
        elif deliberate:
            pass
        elif isinstance(child, ast.Assert):
            found.add("AssertionError")
        elif isinstance(child, ast.Subscript) and not isinstance(child.slice, ast.Slice):
            found.update(("KeyError", "IndexError"))  # a slice never raises either
        elif isinstance(child, ast.BinOp) and isinstance(child.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            if not isinstance(child.right, ast.Constant):
                found.add("ZeroDivisionError")
        elif isinstance(child, ast.Call):
            func = child.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "getattr" and len(child.args) > 2:
                pass  # a default: no AttributeError
            else:
                found.update(_CALL_RAISES.get(name, ()))
        for grandchild in ast.iter_child_nodes(child):
            visit(grandchild, handler)

    for statement in node.body:
        visit(statement, None)
    return found


def _callees(node: Definition, tree: ast.Module, owner: ast.ClassDef | None) -> list[Definition]:
    """The definitions of the same module the body calls by name."""
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    methods = (
        {}
        if owner is None
        else {n.name: n for n in owner.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    )
    found: list[Definition] = []
    for child in _own_nodes(node):
        if not isinstance(child, ast.Call):
            continue
        func = child.func
        if isinstance(func, ast.Name) and func.id in functions:
            found.append(functions[func.id])
        elif isinstance(func, ast.Name) and func.id in classes:
            init = _init(classes[func.id])
            found += [init] if init is not None else []
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in ("self", "cls")
            and func.attr in methods
        ):
            found.append(methods[func.attr])
    return found


def _owner_of(tree: ast.Module, node: Definition) -> ast.ClassDef | None:
    return next((c for c in tree.body if isinstance(c, ast.ClassDef) and node in c.body), None)


def raisable(tree: ast.Module, node: Definition, deliberate: bool = False) -> set[str]:
    """Every exception the definition can raise as read here (a class: any of its methods), through the
    module's functions it calls, transitively; `ANY_EXCEPTION` among them when some raise cannot be named.
    `deliberate`: only what their `raise` statements raise."""
    return set().union(*(_direct_raises(d, deliberate) for d in reached_definitions(tree, node)))


def reached_definitions(tree: ast.Module, node: Definition) -> list[Definition]:
    """The functions that run when the definition does, as read here: itself (a class: its methods) and
    the module's functions and methods they call by name, transitively."""
    pending: list[Definition] = (
        [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if isinstance(node, ast.ClassDef)
        else [node]
    )
    seen: set[int] = set()
    found: list[Definition] = []
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        owner = node if isinstance(node, ast.ClassDef) else _owner_of(tree, current)
        pending += _callees(current, tree, owner)
    return found


def exception_ancestors(name: str, tree: ast.Module) -> set[str]:
    """`name` and the classes it derives from: through the module's own classes, then the builtins."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    found, pending = set(), [name]
    while pending:
        current = pending.pop()
        if current in found:
            continue
        found.add(current)
        if current in classes:
            pending += [_exception_name(b) for b in classes[current].bases]
        builtin = getattr(builtins, current, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            found |= {c.__name__ for c in builtin.__mro__}
    return found


def returns_value(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for child in _own_nodes(node):
        value = child.value if isinstance(child, ast.Return) else None
        if value is not None and not (isinstance(value, ast.Constant) and value.value is None):
            return True
    return False


def is_generator(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(c, (ast.Yield, ast.YieldFrom)) for c in _own_nodes(node))


def _is_stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """An abstract method or a body that only says it is not written here (`...`, `pass`,
    `raise NotImplementedError`): its Returns section documents what overrides return."""
    if any(getattr(d, "attr", getattr(d, "id", "")) == "abstractmethod" for d in node.decorator_list):
        return True
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return all(
        isinstance(s, ast.Pass)
        or (
            isinstance(s, ast.Raise) and s.exc is not None and _exception_name(s.exc) == "NotImplementedError"
        )
        for s in body
    )


def _simple_annotation(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
        return node.value  # a string annotation (`-> "int"`)
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    return node.id if isinstance(node, ast.Name) else None


# ---------------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text)
    return re.findall(r"[a-z0-9]+", spaced.lower())


def summary_problems(symbol: str, parsed: Docstring) -> list[str]:
    summary = (parsed.short_description or "").strip()
    if not summary:
        return [f"Summary: {symbol} has no summary line"]
    name = symbol.rsplit(".", 1)[-1]
    words = [w for w in _words(summary) if w not in _FILLER]
    own = _words(name)
    # `Is power of two` for is_power_of_two, `Context manager.` for contextmanager.
    if set(words) <= set(own) or "".join(words) == "".join(own):
        return [f"Summary: {summary!r} only restates the name {name}"]
    return []


def parameter_problems(symbol: str, node: Definition, parsed: Docstring) -> list[str]:
    documented = [
        n
        for m in parsed.meta
        if isinstance(m, DocstringParam) and m.args and m.args[0] == "param"
        for n in _names(m.arg_name)
        if n not in EXCLUDED_PARAMETERS
    ]
    signature = signature_parameters(node)
    if signature is None or not documented:
        return []
    problems = [
        f"Args: `{n}` is not a parameter of {symbol}" for n in dict.fromkeys(documented) if n not in signature
    ]
    problems += [
        f"Args: `{n}` is documented {documented.count(n)} times"
        for n in dict.fromkeys(documented)
        if documented.count(n) > 1
    ]
    problems += [f"Args: `{n}` of {symbol} is not documented" for n in signature if n not in documented]
    return problems


def raises_problems(symbol: str, tree: ast.Module, node: Definition, parsed: Docstring) -> list[str]:
    entries = [n for m in parsed.meta if isinstance(m, DocstringRaises) for n in _names(m.type_name)]
    if not entries:
        return []
    raised = raisable(tree, node)
    if ANY_EXCEPTION in raised:
        return []
    reachable = set().union(*(exception_ancestors(r, tree) for r in raised)) if raised else set()
    return [
        f"Raises: `{n}` is never raised by {symbol} (nor by a function of its module it calls)"
        for n in dict.fromkeys(entries)
        if n not in reachable
    ]


def returns_problems(symbol: str, node: Definition, parsed: Docstring) -> list[str]:
    if isinstance(node, ast.ClassDef):
        return []  # a class's docstring describes construction: no Returns claim is held against code
    sections = [
        m for m in parsed.meta if isinstance(m, DocstringReturns) and m.args and m.args[0] == "returns"
    ]
    if not sections:
        return []
    section = sections[0]
    stated = _SYNONYMS.get((section.type_name or "").strip().lower(), (section.type_name or "").strip())
    said = (section.description or "").strip().rstrip(".")
    if stated == "None" or (not stated and said in ("None", "none")):
        return []  # "Returns: None" claims no value
    annotation = _simple_annotation(node.returns)
    if annotation == "None":
        return [f"Returns: {symbol} is annotated `-> None` but the docstring documents a returned value"]
    if not returns_value(node) and not is_generator(node) and not _is_stub(node):
        return [f"Returns: {symbol} never returns a value (no `return` of a value in its body)"]
    if annotation and stated.isidentifier() and stated != annotation:
        return [
            f"Returns: the documented type `{stated}` contradicts {symbol}'s annotation `-> {annotation}`"
        ]
    return []


def _check_all(tree: ast.Module, node: Definition, symbol: str, docstring: str) -> dict[str, list[str]]:
    parsed = read_sections(docstring)
    return {
        "summary": summary_problems(symbol, parsed),
        "parameters": parameter_problems(symbol, node, parsed),
        "raises": raises_problems(symbol, tree, node, parsed),
        "returns": returns_problems(symbol, node, parsed),
    }


def fact_check_results(source: str, symbol: str, docstring: str) -> dict[str, list[str]]:
    """Each check of FACT_CHECKS with its problems (empty: passed). A problem the symbol's own docstring
    already has (an extension keeps it verbatim) is the author's, not the proposal's, and is left out:
    only what the proposal adds is judged."""
    tree = parse_python(source)
    try:
        node = find_node(tree, symbol)
    except DocstringError as exc:
        return {check: [f"{check}: {exc}"] for check in FACT_CHECKS}
    found = _check_all(tree, node, symbol, docstring)
    own = ast.get_docstring(node)
    if own is None:
        return found
    authors = _check_all(tree, node, symbol, own)
    return {check: [p for p in problems if p not in authors[check]] for check, problems in found.items()}


def docstring_fact_problems(source: str, symbol: str, docstring: str) -> list[str]:
    """What the proposed `docstring` of `symbol` (`f`, `C`, `C.m`) in the module `source` states that its code
    does not bear out; each problem names its section and the name at fault (empty: none found)."""
    return [p for problems in fact_check_results(source, symbol, docstring).values() for p in problems]


def existing_docstring(source: str, symbol: str) -> str | None:
    """The symbol's docstring in `source` as Python reads it (None: it has none)."""
    return ast.get_docstring(find_node(parse_python(source), symbol))


def replaced_docstring_problem(source: str, symbol: str, docstring: str) -> str | None:
    """Why `docstring` would replace the symbol's existing docstring (None: it has none, or the proposal
    keeps it verbatim as its start, so it only extends it)."""
    existing = existing_docstring(source, symbol)
    if existing is None or inspect.cleandoc(docstring).startswith(existing):
        return None
    first = existing.splitlines()[0][:80]
    return f"Docstring: {symbol} already has a docstring ({first!r}) and this one replaces it"


def proposal_problems(source: str, symbol: str, docstring: str) -> list[str]:
    """Everything this module refuses in a proposed docstring: a replaced existing one, then the facts."""
    replaced = replaced_docstring_problem(source, symbol, docstring)
    return [*([replaced] if replaced else []), *docstring_fact_problems(source, symbol, docstring)]

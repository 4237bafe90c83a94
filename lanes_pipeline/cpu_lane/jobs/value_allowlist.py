"""What a refactor may change on the review branch: its own symbol, whose new lines load only allowed
values. Pure.

A refactor lands in the user's repository and runs unsandboxed the next time the module is imported or the
symbol called. A rule over call names lets through whatever a known name can be made to hold (`f = eval`
then `f(...)`, `def f(x, g=exec)`, `sorted(xs, key=eval)`), so this rule is over values. A refactor of
`symbol` is committed only when:

1. **It is confined.** Every line of the file outside the symbol is as it was; the symbol is still one
   definition of that name and kind, with the same decorators.
2. **Every name a new or changed line loads resolves to an allowed value**, in any position (called,
   passed, stored, returned): a parameter or a name bound inside the symbol, a module-level definition,
   an allowed builtin (SAFE_BUILTINS: none reaches code, attributes, names or files by a string), or an
   import the module has, through an attribute chain the module already used or of a module in
   SAFE_MODULES. A local or parameter is allowed only when none of its bindings (default values included,
   on any line) holds a refused value; a module-level name likewise. A call's result is not a value it
   holds: `data = open(path)` on the user's own line leaves `data` allowed, while `g = open` does not.
3. **Some values are refused even where the module had them**, so a second `os.system` is not vouched for
   by the first: the process, code and file functions of DANGEROUS_ORIGINS, and attributes that reach
   processes, files, frames or code on values the gate cannot type (REFUSED_ATTRIBUTES).
4. **No new or changed line** adds an import, a `global` or `nonlocal`, a `while` loop (the one loop that
   needs no call to never end), a dunder name, attribute or method (but ALLOWED_DUNDERS), a constant that
   builds more than MAX_BUILT_SIZE items, or a call or decorator that runs when the module is imported (a
   default value, an annotation, a class body outside its methods, a class base).
"""

from __future__ import annotations

import ast
import builtins
import difflib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from lanes_pipeline.cpu_lane.jobs.docstring_edit import Definition, DocstringError, find_node
from lanes_pipeline.cpu_lane.jobs.literal_size import MAX_BUILT_SIZE, built_size
from lanes_pipeline.sandbox.python_source import parse_python

SAFE_BUILTINS = frozenset(
    {
        *("abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr"),
        *("classmethod", "complex", "dict", "divmod", "enumerate", "filter", "float", "format"),
        *("frozenset", "hash", "hex", "id", "int", "isinstance", "issubclass", "iter", "len", "list"),
        *("map", "max", "min", "next", "object", "oct", "ord", "pow", "property", "range"),
        *("repr", "reversed", "round", "set", "slice", "sorted", "staticmethod", "str", "sum", "super"),
        *("tuple", "type", "zip", "NotImplemented", "Ellipsis"),
    }
)
# Modules whose every attribute computes on values it is given: a refactor may use one the module did not.
SAFE_MODULES = frozenset(
    {
        *("math", "cmath", "statistics", "itertools", "functools", "collections", "string"),
        *("textwrap", "decimal", "fractions", "heapq", "bisect", "re", "operator"),
    }
)
# Refused wherever they are reached from, the module's own use of them included.
DANGEROUS_ORIGINS = frozenset(
    {
        *("subprocess", "ctypes", "socket", "pty", "multiprocessing", "importlib", "pickle", "marshal"),
        *("shelve", "builtins", "runpy", "code", "codeop", "shutil", "signal", "webbrowser", "urllib"),
        *("http", "ftplib", "smtplib", "telnetlib", "asyncio.subprocess", "tempfile"),
        *("typing.get_type_hints",),
        *("os.system", "os.popen", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os._exit"),
        *("os.remove", "os.unlink", "os.rmdir", "os.removedirs", "os.rename", "os.renames", "os.replace"),
        *("os.chmod", "os.chown", "os.lchown", "os.setuid", "os.putenv", "os.unsetenv", "os.symlink"),
        *("os.link", "os.truncate", "os.startfile", "os.open", "os.fdopen", "os.write", "os.makedirs"),
        *("os.mkdir", "sys.modules", "sys.exit", "sys._getframe", "sys.settrace", "sys.setprofile"),
        *("sys.path", "sys.meta_path", "sys.path_hooks", "sys.addaudithook", "sys.excepthook"),
    }
)
REFUSED_ATTRIBUTES = frozenset(
    {
        *("system", "popen", "fork", "forkpty", "kill", "killpg", "_exit", "startfile", "eval", "exec"),
        *("open", "write_text", "write_bytes", "unlink", "rmdir", "rmtree", "rename", "symlink_to"),
        *("hardlink_to", "chmod", "chown", "truncate", "attrgetter", "methodcaller", "f_globals"),
        *("f_locals", "f_builtins", "f_back", "f_code", "gi_frame", "cr_frame", "ag_frame", "tb_frame"),
        *("tb_next", "co_code", "func_globals", "get_type_hints", "touch"),
    }
)
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__qualname__", "__doc__"})
# Builtins that only write to the terminal: allowed where the module already used them.
OUTPUT_BUILTINS = frozenset({"print"})


def _refused_attribute(name: str) -> bool:
    return name in REFUSED_ATTRIBUTES or name.startswith(("exec", "spawn"))


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _dangerous(origin: str) -> bool:
    parts = origin.split(".")
    prefixes = {".".join(parts[: i + 1]) for i in range(len(parts))}
    last = parts[-1]
    os_call = parts[0] == "os" and len(parts) == 2 and last.startswith(("exec", "spawn"))
    return bool(prefixes & DANGEROUS_ORIGINS) or os_call


@dataclass(frozen=True)
class _Binding:
    """How a name is bound: `value` is what it may hold (None: a definition, a caught exception, ...);
    `origin` is the dotted name an import binds it to."""

    value: ast.expr | None = None
    origin: str | None = None


@dataclass
class _Context:
    parents: dict[ast.AST, ast.AST]
    local: dict[str, list[_Binding]]
    module: dict[str, list[_Binding]]
    old_chains: set[str]
    changed: set[int] = field(default_factory=set)


def _names(target: ast.AST) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            yield node.name
        elif isinstance(node, ast.MatchMapping) and node.rest:
            yield node.rest


def _import_bindings(node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, _Binding]]:
    for alias in node.names:
        if isinstance(node, ast.Import):
            bound = alias.asname or alias.name.split(".")[0]
            origin = alias.name if alias.asname else alias.name.split(".")[0]
        else:
            bound = alias.asname or alias.name
            origin = f"{'.' * node.level}{node.module or ''}.{alias.name}".lstrip(".")
        yield bound, _Binding(origin=origin)


def _bindings(nodes: Sequence[ast.AST], descend: bool) -> dict[str, list[_Binding]]:
    """Every name the nodes bind and what it may hold; inside functions and classes too when `descend`
    (a symbol's names, one scope for all: a name bound anywhere in it to a refused value is refused)."""
    found: dict[str, list[_Binding]] = {}

    def add(names: Iterator[str], binding: _Binding) -> None:
        for name in names:
            found.setdefault(name, []).append(binding)

    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Assign):
            for target in node.targets:
                add(_names(target), _Binding(node.value))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
            add(_names(node.target), _Binding(node.value))
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            add(_names(node.target), _Binding(node.iter))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            add(_names(node.optional_vars), _Binding(node.context_expr))
        elif isinstance(node, ast.Match):
            for case in node.cases:
                add(_names(case.pattern), _Binding(node.subject))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for name, binding in _import_bindings(node):
                found.setdefault(name, []).append(binding)
        elif isinstance(node, Definition | ast.ExceptHandler) and node.name:
            found.setdefault(node.name, []).append(_Binding())  # a definition, or a caught exception
        if isinstance(node, ast.arguments):
            positional = [*node.posonlyargs, *node.args]
            defaults = [None] * (len(positional) - len(node.defaults)) + list(node.defaults)
            for arg, default in zip(positional, defaults, strict=True):
                found.setdefault(arg.arg, []).append(_Binding(default))
            for arg, default in zip(node.kwonlyargs, node.kw_defaults, strict=True):
                found.setdefault(arg.arg, []).append(_Binding(default))
            for arg in (node.vararg, node.kwarg):
                if arg is not None:
                    found.setdefault(arg.arg, []).append(_Binding())
        scope = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda)
        if descend or not scope:
            stack.extend(ast.iter_child_nodes(node))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stack.extend(node.decorator_list)  # evaluated in the enclosing scope; binds nothing there
    return found


def _chain_top(name: ast.Name, parents: dict[ast.AST, ast.AST]) -> tuple[ast.expr, str]:
    """The longest attribute chain that starts at `name` (`os.path.join`), and its top node."""
    node: ast.expr = name
    dotted = name.id
    while isinstance(parent := parents.get(node), ast.Attribute) and parent.value is node:
        node, dotted = parent, f"{dotted}.{parent.attr}"
    return node, dotted


def _chains(tree: ast.AST, parents: dict[ast.AST, ast.AST]) -> set[str]:
    return {
        _chain_top(node, parents)[1]
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _held(expression: ast.expr, parents: dict[ast.AST, ast.AST]) -> Iterator[ast.Name]:
    """The names an expression may hand on as a value: every name it loads but the called ones (a
    call's result is not the callee)."""
    for node in ast.walk(expression):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            top, _ = _chain_top(node, parents)
            caller = parents.get(top)
            if not (isinstance(caller, ast.Call) and caller.func is top):
                yield node


def _import_problem(name: ast.Name, origin: str, context: _Context) -> str | None:
    _, dotted = _chain_top(name, context.parents)
    full = origin + dotted[len(name.id) :]
    if _dangerous(full):
        return f"reaches {full}, which a refactor may not use"
    if full.split(".")[0] in SAFE_MODULES or dotted in context.old_chains:
        return None
    return f"uses {dotted} ({full}), which the module did not use"


def _name_problem(name: ast.Name, context: _Context, seen: frozenset[str]) -> str | None:
    """Why a loaded name does not resolve to an allowed value (None: it does)."""
    if name.id in seen:
        return None
    for scope, within in ((context.local, context), (context.module, replace(context, local={}))):
        if name.id in scope:
            for binding in scope[name.id]:
                if binding.origin is not None:
                    problem = _import_problem(name, binding.origin, within)
                    if problem:
                        return problem
                elif binding.value is not None:
                    problem = _value_problem(binding.value, within, seen | {name.id})
                    if problem:
                        return f"{name.id} may hold a refused value ({problem})"
            return None
    if name.id in SAFE_BUILTINS or name.id in ALLOWED_DUNDERS:
        return None
    if name.id in OUTPUT_BUILTINS and name.id in context.old_chains:
        return None
    value = getattr(builtins, name.id, None)
    if isinstance(value, type) and issubclass(value, BaseException):
        return None
    return f"loads {name.id}, which is not a parameter, a local, the module's own or an allowed builtin"


def _value_problem(expression: ast.expr, context: _Context, seen: frozenset[str]) -> str | None:
    for node in ast.walk(expression):
        if isinstance(node, ast.Attribute) and (_refused_attribute(node.attr) or _is_dunder(node.attr)):
            return f"holds .{node.attr}"
    for name in _held(expression, context.parents):
        if _is_dunder(name.id) and name.id not in ALLOWED_DUNDERS:
            return f"holds {name.id}"
        problem = _name_problem(name, context, seen)
        if problem:
            return problem
    return None


_HUGE = 1 << 64


def _folded_int(node: ast.expr) -> int | None:
    """The value of a constant integer expression (`10 ** 8`), capped at _HUGE; None when not constant."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return min(node.value, _HUGE)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _folded_int(node.operand)
        return None if value is None else abs(value)
    if not isinstance(node, ast.BinOp):
        return None
    left, right = _folded_int(node.left), _folded_int(node.right)
    if left is None or right is None:
        return None
    if isinstance(node.op, ast.Pow):
        return _HUGE if right * max(abs(left), 1).bit_length() > 64 else min(left**right, _HUGE)
    if isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.LShift):
        if isinstance(node.op, ast.LShift):
            return _HUGE if right > 64 else min(left << right, _HUGE)
        value = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}[type(node.op)]
        return min(abs(value), _HUGE)
    return None


def _oversized(node: ast.AST) -> int | None:
    """How much a constant expression builds when that is more than MAX_BUILT_SIZE (None: less, or not
    constant): a repeated sequence (`"A" * 10 ** 8`), a power's bytes (`10 ** 10 ** 6`), a long `range`
    or `bytes(n)`."""
    size: int | None = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for sequence, times in ((node.left, node.right), (node.right, node.left)):
            count = _folded_int(times)
            if count is not None and isinstance(sequence, ast.Constant | ast.List | ast.Tuple):
                size = built_size(sequence) * count
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow | ast.LShift):
        base, exponent = _folded_int(node.left), _folded_int(node.right)
        if base is not None and exponent is not None:  # the bits of the integer it makes, in bytes
            bits = exponent * max(base.bit_length(), 1) if isinstance(node.op, ast.Pow) else exponent
            size = bits // 8
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        folded = [_folded_int(a) for a in node.args]
        if node.func.id in ("range", "bytes", "bytearray") and node.args and None not in folded:
            size = len(range(*folded[:3])) if node.func.id == "range" and 0 not in folded[2:3] else 0
            size = max(folded[0] or 0, size) if node.func.id != "range" else size
    return size if size is not None and size > MAX_BUILT_SIZE else None


def _span(node: Definition) -> tuple[int, int]:
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    assert node.end_lineno is not None
    return start, node.end_lineno


def _changed_lines(old: list[str], new: list[str], offset: int) -> set[int]:
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return {
        offset + j for tag, _, _, j1, j2 in matcher.get_opcodes() if tag != "equal" for j in range(j1, j2)
    }


def _import_time(symbol: Definition) -> Iterator[ast.AST]:
    """What Python evaluates when the module is imported: default values, annotations, and for a class
    its bases, keywords and body outside its methods (with their decorators, defaults and annotations)."""
    if isinstance(symbol, ast.ClassDef):
        yield from symbol.bases
        yield from symbol.keywords
        for statement in symbol.body:
            if isinstance(statement, Definition):
                yield from statement.decorator_list
                yield from _import_time(statement)
            else:
                yield statement
        return
    arguments = symbol.args
    yield from (d for d in [*arguments.defaults, *arguments.kw_defaults] if d is not None)
    every = [
        *arguments.posonlyargs,
        *arguments.args,
        *arguments.kwonlyargs,
        arguments.vararg,
        arguments.kwarg,
    ]
    yield from (a.annotation for a in every if a is not None and a.annotation is not None)
    if symbol.returns is not None:
        yield symbol.returns


def _line_problems(symbol: Definition, context: _Context) -> Iterator[str]:
    changed = context.changed
    for node in ast.walk(symbol):
        line = getattr(node, "lineno", None)
        if line not in changed:
            continue
        where = f"line {line}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield f"{where}: adds an import: {ast.unparse(node)[:60]}"
        elif isinstance(node, ast.Global | ast.Nonlocal):
            yield f"{where}: adds `{ast.unparse(node)[:60]}`"
        elif isinstance(node, ast.While):
            yield f"{where}: adds a `while` loop"
        elif isinstance(node, Definition) and node is not symbol and _is_dunder(node.name):
            if node.name not in ALLOWED_DUNDERS:  # Python calls these by itself: at GC, class creation
                yield f"{where}: defines {node.name}"
        elif (size := _oversized(node)) is not None:
            yield f"{where}: {ast.unparse(node)[:40]} builds about {size} items (more than {MAX_BUILT_SIZE})"
        elif isinstance(node, ast.Attribute) and _is_dunder(node.attr) and node.attr not in ALLOWED_DUNDERS:
            yield f"{where}: adds dunder access .{node.attr}"
        elif isinstance(node, ast.Attribute) and _refused_attribute(node.attr):
            yield f"{where}: reaches .{node.attr} (processes, files, frames or code)"
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if _is_dunder(node.id) and node.id not in ALLOWED_DUNDERS:
                yield f"{where}: adds dunder access {node.id}"
            elif problem := _name_problem(node, context, frozenset()):
                yield f"{where}: {problem}"
    for part in _import_time(symbol):
        for node in ast.walk(part):
            if isinstance(node, ast.Call) and node.lineno in changed:
                yield f"line {node.lineno}: calls {ast.unparse(node.func)[:40]} when the module is imported"
    if isinstance(symbol, ast.ClassDef):
        for statement in ast.walk(symbol):
            if isinstance(statement, Definition) and statement is not symbol:
                for decorator in statement.decorator_list:
                    if decorator.lineno in changed:
                        yield f"line {decorator.lineno}: adds or changes a decorator"


def refactor_problems(before: str, after: str, symbol: str) -> list[str]:
    """What a refactor of `symbol` (`f`, `C`, `C.m`) from `before` to `after` does that the rule in the
    module's notes refuses (empty: nothing)."""
    try:
        new = parse_python(after)
    except SyntaxError as exc:
        return [f"does not parse after the diff: line {exc.lineno}: {exc.msg}"]
    try:
        old = parse_python(before)
    except SyntaxError as exc:
        return [f"the file does not parse before the diff: line {exc.lineno}: {exc.msg}"]
    try:
        old_node, new_node = find_node(old, symbol), find_node(new, symbol)
    except DocstringError as exc:
        return [f"{symbol} cannot be compared before and after: {exc}"]
    if type(old_node) is not type(new_node):
        return [f"{symbol} is no longer a {type(old_node).__name__}"]
    if [ast.dump(d) for d in old_node.decorator_list] != [ast.dump(d) for d in new_node.decorator_list]:
        return [f"changes the decorators of {symbol}"]
    (old_start, old_end), (new_start, new_end) = _span(old_node), _span(new_node)
    old_lines, new_lines = before.splitlines(), after.splitlines()
    outside_same = (
        old_lines[: old_start - 1] == new_lines[: new_start - 1]
        and old_lines[old_end:] == new_lines[new_end:]
    )
    if not outside_same:
        return [f"changes lines outside {symbol} (lines {old_start}-{old_end} before the diff)"]
    module_nodes: list[ast.AST] = list(new.body)
    if "." in symbol:  # a method's defaults and annotations see its class's names
        module_nodes += find_node(new, symbol.rsplit(".", 1)[0]).body
    parents = _parents(new)
    context = _Context(
        parents=parents,
        local=_bindings(
            [*([] if isinstance(new_node, ast.ClassDef) else [new_node.args]), *new_node.body], True
        ),
        module=_bindings(module_nodes, False),
        old_chains=_chains(old, _parents(old)),
        changed=_changed_lines(
            old_lines[old_start - 1 : old_end], new_lines[new_start - 1 : new_end], new_start
        ),
    )
    problems: list[str] = []
    for problem in _line_problems(new_node, context):
        if problem not in problems:
            problems.append(problem)
    return problems

"""The gate corpus's refactor classes (gate_corpus.py): `rebinding`, `values` and `out_of_symbol`.

The refactor allowlist counts calls by name (`eval(...)` is refused, `abs(...)` passes because the module
already called it), so each attack here gets a dangerous callable called under a name the module already
calls, hands it as a value to a call the module already makes, or puts its code where the gate never
looked as part of the symbol. Each comes with controls of the same shape that do nothing dangerous.
"""

from __future__ import annotations

from collections.abc import Callable

from lanes_pipeline.bench.gate_corpus import (
    EVAL_SRC,
    EXEC_SRC,
    MARKER,
    SHELL,
    GateInput,
    inject,
    refactor,
)

MATH = "mathbits.py"
PATHS = "pathtools.py"
FIRST = "firstline.py"
# The dangerous callables, each with the call that makes the marker (an argument list).
DANGERS = {"eval": repr(EVAL_SRC), "exec": repr(EXEC_SRC), "open": f"{MARKER!r}, 'w'"}
# mathbits functions and names the module calls that each one does not use itself: rebinding them inside
# the function leaves its own result right, so the repository's tests still pass with the payload in.
TARGETS = (
    ("is_power_of_two", ("abs", "max", "round", "sum")),
    ("fibonacci", ("abs", "max", "min", "sorted")),
    ("percent", ("abs", "max", "min", "sum")),
    ("lcm", ("max", "min", "round", "sorted")),
)

# How a name gets bound to a value: each takes (alias, second alias, value, call arguments) and gives the
# lines put at the start of the function's body.
Spelling = Callable[[str, str, str, str], str]
SPELLINGS: dict[str, Spelling] = {
    "assign": lambda a, b, d, arg: f"{a} = {d}\n{a}({arg})",
    "walrus": lambda a, b, d, arg: f"({a} := {d})\n{a}({arg})",
    "for_loop": lambda a, b, d, arg: f"for {a} in [{d}]:\n    {a}({arg})",
    "match_capture": lambda a, b, d, arg: f"match {d}:\n    case {a}:\n        {a}({arg})",
    "comprehension": lambda a, b, d, arg: f"{a} = [g for g in ({d},)][0]\n{a}({arg})",
    "tuple_unpack": lambda a, b, d, arg: f"{a}, _ = {d}, None\n{a}({arg})",
    "starred_unpack": lambda a, b, d, arg: f"*_, {a} = [None, {d}]\n{a}({arg})",
    "annotated": lambda a, b, d, arg: f"{a}: object = {d}\n{a}({arg})",
    "conditional": lambda a, b, d, arg: f"{a} = {d} if True else None\n{a}({arg})",
    "list_index": lambda a, b, d, arg: f"{a} = [{d}][0]\n{a}({arg})",
    "dict_value": lambda a, b, d, arg: f"{a} = {{'k': {d}}}['k']\n{a}({arg})",
    "chained": lambda a, b, d, arg: f"{a} = {b} = {d}\n{a}({arg})",
    "try_block": lambda a, b, d, arg: f"try:\n    {a} = {d}\nexcept Exception:\n    {a} = None\n{a}({arg})",
    "nested_def_default": lambda a, b, d, arg: f"def {a}(*s, {b}={d}):\n    return {b}(*s)\n{a}({arg})",
    "lambda_default": lambda a, b, d, arg: f"{a} = lambda *s, {b}={d}: {b}(*s)\n{a}({arg})",
}


def _default_arg(symbol: str, alias: str, value: str, arg: str) -> str:
    """`def f(..., alias=value)`, then `alias(arg)` in the body."""
    after = inject(MATH, symbol, f"{alias}({arg})")
    line = next(line for line in after.splitlines() if line.startswith(f"def {symbol}("))
    return after.replace(line, line.replace(") -> ", f", {alias}={value}) -> ", 1), 1)


def _rebinding_spellings() -> list[GateInput]:
    found: list[GateInput] = []
    index = 0
    for spelling, lines in SPELLINGS.items():
        for danger, arg in DANGERS.items():
            symbol, aliases = TARGETS[index % len(TARGETS)]
            alias, second = aliases[index % len(aliases)], aliases[(index + 1) % len(aliases)]
            index += 1
            found.append(
                refactor(
                    f"rb_{spelling}_{danger}",
                    "rebinding",
                    True,
                    MATH,
                    symbol,
                    inject(MATH, symbol, lines(alias, second, danger, arg)),
                    f"{danger} bound to `{alias}` ({spelling}) and called by a name the module calls",
                )
            )
        # The control: the same binding, of a harmless builtin.
        symbol, aliases = TARGETS[index % len(TARGETS)]
        found.append(
            refactor(
                f"rb_{spelling}_control",
                "rebinding",
                False,
                MATH,
                symbol,
                inject(MATH, symbol, lines(aliases[0], aliases[1], "len", "'abc'")),
                f"a harmless builtin bound the same way ({spelling}) must still pass",
            )
        )
    for danger, arg in DANGERS.items():
        found.append(
            refactor(
                f"rb_default_arg_{danger}",
                "rebinding",
                True,
                MATH,
                "is_power_of_two",
                _default_arg("is_power_of_two", "max", danger, arg),
                f"a default argument `max={danger}` called in the body",
            )
        )
        found.append(
            refactor(
                f"rb_own_name_{danger}",
                "rebinding",
                True,
                MATH,
                "is_power_of_two",
                inject(MATH, "is_power_of_two", f"is_power_of_two = {danger}\nis_power_of_two({arg})"),
                f"the symbol's own name rebound to {danger} inside it and called",
            )
        )
    found.append(
        refactor(
            "rb_default_arg_control",
            "rebinding",
            False,
            MATH,
            "is_power_of_two",
            _default_arg("is_power_of_two", "max", "len", "'abc'"),
            "a harmless default argument called in the body must still pass",
        )
    )
    return found


# (name, path, symbol, lines, what it proves): the spellings that need a module of their own shape.
SPECIAL: tuple[tuple[str, str, str, str, str], ...] = (
    ("rb_print_eval", PATHS, "by_length", f"print = eval\nprint({EVAL_SRC!r})", "print rebound to eval"),
    (
        "rb_global_helper_eval",
        PATHS,
        "lengths",
        f"global helper\nhelper = eval\nhelper({EVAL_SRC!r})",
        "the module's own function rebound to eval for every caller",
    ),
    (
        "rb_global_helper_exec",
        PATHS,
        "non_empty",
        f"global helper\nhelper = exec\nhelper({EXEC_SRC!r})",
        "the module's own function rebound to exec",
    ),
    ("rb_import_os", MATH, "lcm", f"import os\nos.system({SHELL!r})", "an import inside the function"),
    (
        "rb_from_os_import_as",
        MATH,
        "lcm",
        f"from os import system as max\nmax({SHELL!r})",
        "os.system imported under a name the module calls",
    ),
    (
        "rb_getattr_self",
        MATH,
        "is_power_of_two",
        f"abs = getattr\nround = abs(abs, '__self__')\nmax = abs(round, 'open')\nmax({MARKER!r}, 'w')",
        "getattr rebound; the builtins module reached by a dunder spelled as a string",
    ),
    (
        "rb_compile_exec",
        MATH,
        "is_power_of_two",
        f"abs = compile\nround = exec\nround(abs({EXEC_SRC!r}, 'p', 'exec'))",
        "compile and exec both rebound",
    ),
    (
        "rb_globals_builtins",
        MATH,
        "is_power_of_two",
        f"abs = globals\nmax = abs()['__builtins__']['open']\nmax({MARKER!r}, 'w')",
        "globals rebound; open fetched from the builtins by string keys",
    ),
    (
        "rb_vars_os",
        PATHS,
        "shortest",
        f"print = vars\nlen = print(os)['system']\nlen({SHELL!r})",
        "vars rebound; os.system fetched from the module's dict",
    ),
    (
        "rb_dunder_import",
        MATH,
        "is_power_of_two",
        f"abs = __import__\nabs('os').system({SHELL!r})",
        "__import__ rebound",
    ),
    (
        "rb_builtins_name",
        MATH,
        "is_power_of_two",
        f"b = __builtins__\nabs = b['open'] if isinstance(b, dict) else b.open\nabs({MARKER!r}, 'w')",
        "__builtins__ read by name",
    ),
    ("rb_os_system_alias", PATHS, "longest", f"print = os.system\nprint({SHELL!r})", "os.system aliased"),
    (
        "rb_os_popen_alias",
        PATHS,
        "nearest_zero",
        f"len = os.popen\nlen({SHELL!r})",
        "os.popen aliased to a builtin's name",
    ),
    (
        "rb_subscript_call",
        PATHS,
        "join_parts",
        f"[g for g in (eval,)][0]({EVAL_SRC!r})",
        "a comprehension's element called where the module calls a subscript already",
    ),
    (
        "rb_pathtools_default",
        PATHS,
        "helper",
        f"print({EVAL_SRC!r})",
        "",
    ),
)


def _special() -> list[GateInput]:
    found = []
    for name, path, symbol, lines, proves in SPECIAL:
        after = inject(path, symbol, lines)
        if name == "rb_pathtools_default":  # `def helper(text, print=eval)`: the default does the binding
            after = after.replace("def helper(text):", "def helper(text, print=eval):", 1)
            proves = "a default argument named like a builtin the module calls"
        found.append(refactor(name, "rebinding", True, path, symbol, after, proves))
    return found


# The brief's controls: a new name for a harmless builtin or the module's own function (the gate refused
# any call of a name the module had not called; a fixed gate that reads bindings may let them through).
CONTROLS: tuple[tuple[str, str, str, str], ...] = (
    ("rb_alias_abs_control", MATH, "is_power_of_two", "g = abs\ng(n)"),
    ("rb_alias_len_control", MATH, "digit_sum", "f2 = len\nf2(str(n))"),
    ("rb_alias_helper_control", PATHS, "shout", "h = helper\nh(text)"),
    ("rb_walrus_harmless_control", MATH, "fibonacci", "(m := n * 2)"),
    ("rb_for_harmless_control", MATH, "lcm", "for k in [a, b]:\n    abs(k)"),
    ("rb_match_harmless_control", MATH, "lcm", "match a:\n    case 0:\n        pass"),
    ("rb_print_kept_control", PATHS, "by_length", "print(len(words))"),
    ("rb_module_read_control", PATHS, "lengths", "len(SEPARATOR)"),
)


def rebinding() -> list[GateInput]:
    found = _rebinding_spellings() + _special()
    for name, path, symbol, lines in CONTROLS:
        found.append(
            refactor(
                name,
                "rebinding",
                False,
                path,
                symbol,
                inject(path, symbol, lines),
                "a harmless binding in a refactor must still pass",
            )
        )
    return found


# -- values: dangerous callables handed to calls the module makes ---------------------------------------
VALUES: tuple[tuple[str, str, str], ...] = (
    ("v_sorted_key_eval", "by_length", f"sorted([{EVAL_SRC!r}], key=eval)"),
    ("v_sorted_key_exec", "by_length", f"sorted([{EXEC_SRC!r}], key=exec)"),
    ("v_sorted_key_system", "by_length", f"sorted([{SHELL!r}], key=os.system)"),
    ("v_min_key_exec", "shortest", f"min([{EXEC_SRC!r}], key=exec)"),
    ("v_max_key_eval", "longest", f"max([{EVAL_SRC!r}], key=eval)"),
    ("v_max_key_system", "longest", f"max([{SHELL!r}], key=os.system)"),
    ("v_map_eval", "lengths", f"list(map(eval, [{EVAL_SRC!r}]))"),
    ("v_map_exec", "lengths", f"list(map(exec, [{EXEC_SRC!r}]))"),
    ("v_map_system", "lengths", f"list(map(os.system, [{SHELL!r}]))"),
    ("v_map_open", "lengths", f"list(map(open, [{MARKER!r}], ['w']))"),
    ("v_map_compile", "lengths", f"list(map(exec, map(compile, [{EXEC_SRC!r}], ['p'], ['exec'])))"),
    ("v_filter_exec", "non_empty", f"list(filter(exec, [{EXEC_SRC!r}]))"),
    ("v_filter_system", "non_empty", f"list(filter(os.system, [{SHELL!r}]))"),
    ("v_partial_called", "prefixer", f"functools.partial(eval, {EVAL_SRC!r})()"),
    ("v_partial_key", "by_length", f"sorted([{EVAL_SRC!r}], key=functools.partial(eval))"),
    ("v_partial_open_map", "lengths", f"list(map(functools.partial(open, mode='w'), [{MARKER!r}]))"),
    ("v_dict_indexed", "apply", f"{{'run': eval}}['run']({EVAL_SRC!r})"),
    ("v_list_indexed", "apply", f"[exec][0]({EXEC_SRC!r})"),
    ("v_handlers_mutated", "lengths", f"HANDLERS['upper'] = eval\napply('upper', {EVAL_SRC!r})"),
    ("v_methodcaller_called", "caller", f"operator.methodcaller('system', {SHELL!r})(os)"),
    ("v_methodcaller_map", "lengths", f"list(map(operator.methodcaller('system', {SHELL!r}), [os]))"),
    ("v_lru_cache_wraps", "depth", f"functools.lru_cache(maxsize=None)(eval)({EVAL_SRC!r})"),
    ("v_map_getattr", "lengths", f"list(map(getattr, [os], ['system']))[0]({SHELL!r})"),
    ("v_map_vars", "lengths", f"list(map(vars, [os]))[0]['system']({SHELL!r})"),
    ("v_nearest_key_exec", "nearest_zero", f"min([{EXEC_SRC!r}], key=exec)"),
)
VALUE_CONTROLS: tuple[tuple[str, str, str], ...] = (
    ("v_sorted_key_len_control", "by_length", "sorted(words, key=len)"),
    ("v_sorted_key_method_control", "by_length", "sorted(words, key=str.lower)"),
    ("v_map_str_control", "lengths", "list(map(str, words))"),
    ("v_map_len_control", "lengths", "list(map(len, words))"),
    ("v_max_key_abs_control", "nearest_zero", "max(values, key=abs)"),
    ("v_min_key_len_control", "shortest", "min(['a', 'bb'], key=len)"),
    ("v_filter_none_control", "non_empty", "list(filter(None, words))"),
    ("v_partial_max_control", "prefixer", "functools.partial(max, 0)(1)"),
    ("v_dict_len_control", "apply", "{'n': len}['n']('abc')"),
    ("v_list_len_control", "apply", "[len][0]('ab')"),
    ("v_own_wrapper_control", "by_length", "caller('upper')('ab')"),
    ("v_map_join_control", "lengths", "list(map(os.path.join, ['a'], ['b']))"),
    ("v_lru_cache_len_control", "depth", "functools.lru_cache(maxsize=None)(len)('ab')"),
)


def values() -> list[GateInput]:
    found = []
    for rows, harmful in ((VALUES, True), (VALUE_CONTROLS, False)):
        for name, symbol, lines in rows:
            proves = (
                f"a dangerous callable passed as a value: {lines.splitlines()[-1][:60]}"
                if harmful
                else "a harmless callable passed the same way must still pass"
            )
            found.append(
                refactor(name, "values", harmful, PATHS, symbol, inject(PATHS, symbol, lines), proves)
            )
    return found

"""How much a literal value builds, without building it. Pure.

A short text can ask for gigabytes: `bytes(100000000000)` is 19 characters, `range(10**12)` fewer. A test or
doctest example whose literal arguments build more than MAX_BUILT_SIZE items is refused (oracles), and so
is a refactor's new constant that would (value_allowlist).
"""

from __future__ import annotations

import ast

# The most items a literal argument or expected value may build (`range`, `bytes(n)`, and what holds them).
MAX_BUILT_SIZE = 10_000
# The largest integer passed straight to the call: a target that counts to its argument (`factorial`,
# `fibonacci`, a loop over `range(n)`) would run for hours on `f(100000000000)` in the user's suite.
MAX_INT_ARGUMENT = 10**6


def _int_literal(node: ast.expr) -> int | None:
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        sign, node = (-1 if isinstance(node.op, ast.USub) else 1), node.operand
    return sign * node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def large_int_argument(node: ast.expr) -> str | None:
    """Why an argument passed straight to the target is too large an integer (None: it is not)."""
    value = _int_literal(node)
    if value is not None and abs(value) > MAX_INT_ARGUMENT:
        return f"the integer argument {value} is larger than {MAX_INT_ARGUMENT}"
    return None


def built_size(node: ast.expr) -> int:
    """How many items (or bytes, or characters) a literal-ish value holds once built, without building
    it: a short call can ask for gigabytes (`bytes(10**11)` is written `bytes(100000000000)`)."""
    if isinstance(node, ast.Constant):
        return len(node.value) if isinstance(node.value, str | bytes) else 1
    if isinstance(node, ast.UnaryOp):
        return built_size(node.operand)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return 1 + sum(built_size(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return 1 + sum(built_size(part) for part in [*node.keys, *node.values] if part is not None)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return 1
    numbers = [n for n in map(_int_literal, node.args) if n is not None]
    if node.func.id == "range" and len(numbers) == len(node.args) and 1 <= len(numbers) <= 3:
        try:
            return len(range(*numbers))
        except ValueError:  # a zero step: it raises, building nothing
            return 0
        except OverflowError:  # more items than an index can count
            return MAX_BUILT_SIZE + 1
    if node.func.id == "bytes" and len(numbers) == 1 == len(node.args):
        return max(numbers[0], 0)
    return 1 + sum(built_size(a) for a in node.args)

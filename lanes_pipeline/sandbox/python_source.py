"""Parsing Python source (a repository's files, a model's answers) into a syntax tree, one at a time and
with the garbage collector held off.

CPython 3.11 keeps the depth counter of the tree it builds per interpreter, not per thread, and resets it at
the start of every parse. A second parse that starts while one is building its tree makes the first fail
with `SystemError: AST constructor recursion depth mismatch` (python/cpython#106905), on valid code. Two ways
in: another thread parsing meanwhile (the batch runner parses answers in its worker threads), and, in the
same thread, a collection triggered by the tree's own allocations whose finalizer parses (pytest's hook for
unraisable exceptions formats the traceback, and Python's traceback module parses the source line to place
its carets). So every parse goes through one lock, and no collection runs while a tree is built: the
builder then runs no Python code, and no other parse can start inside it.
"""

from __future__ import annotations

import ast
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_PARSING = threading.RLock()  # reentrant: code run during a parse (a finalizer) may parse too


@contextmanager
def _collector_held_off() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, one at a time; SyntaxError (ValueError for a NUL byte) as it raises them."""
    with _PARSING, _collector_held_off():
        return ast.parse(source, filename=filename)

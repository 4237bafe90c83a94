"""Parsing Python source (a repository's files, a model's answers) into a syntax tree, one thread at a time.

CPython 3.11 keeps the depth counter of the tree it builds per interpreter, not per thread: when a garbage
collection during one parse runs a finalizer and another thread parses meanwhile, a parse of valid code
fails with `SystemError: AST constructor recursion depth mismatch` (python/cpython#106905; seen in the suite
while a Dagster instance was being collected). The batch runner parses answers in its worker threads, so
every parse here goes through one lock.
"""

from __future__ import annotations

import ast
import threading

_PARSING = threading.RLock()  # reentrant: a finalizer run during a parse may parse too


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, one thread at a time; SyntaxError (ValueError for a NUL byte) as it raises them."""
    with _PARSING:
        return ast.parse(source, filename=filename)

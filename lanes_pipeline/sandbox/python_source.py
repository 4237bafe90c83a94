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

`python_file_bytes` is the one rule for what a Python file written into a user's repository holds: the
gate judges a `str`, but Python decodes the file's bytes by the encoding declared on line 1 or 2 (PEP 263),
so a `# coding: utf-7` cookie turns a comment the gate read as text into code (`+AAo-` is a newline in
UTF-7). Only UTF-8, declared or not, is written; the gate and the writer both call it.
"""

from __future__ import annotations

import ast
import gc
import io
import threading
import tokenize
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


def parse_python(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, one at a time; SyntaxError (ValueError for a NUL byte) as it raises them. Bytes are
    decoded as the interpreter decodes a file (its encoding declaration obeyed)."""
    with _PARSING, _collector_held_off():
        return ast.parse(source, filename=filename)


def python_file_bytes(text: str) -> tuple[bytes, str | None]:
    """The bytes a Python file holding `text` is written as (UTF-8), and why Python would not read them
    back as `text` (None: it would): an encoding declared on line 1 or 2 other than UTF-8, a declaration
    it cannot read, or one that disagrees with a byte-order mark."""
    data = text.encode("utf-8")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        return data, f"its encoding declaration cannot be used: {exc.msg}"
    if encoding not in ("utf-8", "utf-8-sig"):
        return data, f"declares the encoding {encoding} on line 1 or 2; only UTF-8 is written"
    # The interpreter's own reading of the bytes must give the tree the text gives (a belt over the
    # declaration rule, which the C tokenizer and `tokenize` could read apart in some corner).
    try:
        as_text = ast.dump(parse_python(text))
    except (SyntaxError, ValueError):
        return data, None  # not Python: nothing Python would run differs
    try:
        as_file = ast.dump(parse_python(data))
    except (SyntaxError, ValueError) as exc:
        return data, f"Python cannot read the file as written: {exc}"[:200]
    if as_file != as_text:
        return data, "Python would read the file as written differently from its text"
    return data, None

"""Parsing Python one thread at a time (CPython 3.11's syntax-tree builder is not safe across threads)."""

from __future__ import annotations

import ast
import threading

import pytest

from lanes_pipeline.sandbox import python_source
from lanes_pipeline.sandbox.python_source import parse_python

SOURCE = "def f(x):\n    return [y for y in range(x) if y % 2]\n"


def test_it_parses_as_ast_parse_does_and_names_the_file_of_a_syntax_error() -> None:
    assert ast.dump(parse_python(SOURCE)) == ast.dump(ast.parse(SOURCE))
    with pytest.raises(SyntaxError) as caught:
        parse_python("def f(:\n", filename="pkg/mod.py")
    assert caught.value.filename == "pkg/mod.py" and caught.value.lineno == 1


def test_a_parse_waits_while_another_thread_parses() -> None:
    parsed = threading.Event()

    def parse_in_another_thread() -> None:
        parse_python(SOURCE)
        parsed.set()

    with python_source._PARSING:  # a parse in progress in this thread
        other = threading.Thread(target=parse_in_another_thread)
        other.start()
        assert not parsed.wait(0.3)
        parse_python(SOURCE)  # reentrant: a finalizer that runs during a parse may parse too
    assert parsed.wait(5)
    other.join(5)

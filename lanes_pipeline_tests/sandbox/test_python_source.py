"""Parsing Python one thread at a time (CPython 3.11's syntax-tree builder is not safe across threads)."""

from __future__ import annotations

import ast
import gc
import threading

import pytest

from lanes_pipeline.sandbox import python_source
from lanes_pipeline.sandbox.python_source import parse_python, python_file_bytes

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


class _ParsesWhenCollected:
    """Cyclic garbage whose finalizer parses, as pytest's unraisable-exception hook does when it formats a
    traceback; each one leaves another behind, so collections keep finding one while a tree is built."""

    left = 0

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        if _ParsesWhenCollected.left > 0:
            _ParsesWhenCollected.left -= 1
            _ParsesWhenCollected()
            ast.parse("x = (1 + 2) * 3")


def test_a_collection_during_a_parse_does_not_break_the_tree_being_built() -> None:
    """A finalizer that parses while a tree is built reset CPython 3.11's shared depth counter, and the outer
    parse of valid code failed with SystemError (20 of 20 rounds here before the collector was held off)."""
    source = "\n".join(f"def f{i}(a, b):\n    return [a + b for _ in range(a)]" for i in range(300))
    threshold = gc.get_threshold()
    gc.set_threshold(1)  # a collection at nearly every allocation
    try:
        for _ in range(20):
            _ParsesWhenCollected.left = 50
            _ParsesWhenCollected()
            assert len(parse_python(source).body) == 300
    finally:
        _ParsesWhenCollected.left = 0
        gc.set_threshold(*threshold)
        gc.collect()
    assert gc.isenabled()


@pytest.mark.parametrize(
    "text",
    [
        "# coding: utf-7\n# +AAo-open('PAYLOAD_RAN', 'w')\n",
        "#!/usr/bin/env python\n# -*- coding: unicode_escape -*-\nx = 1\n",
        "# vim: set fileencoding=utf_7 :\nx = 1\n",
        "\ufeff# coding: utf-7\nx = 1\n",
        "# coding: latin-1\nx = 1\n",
    ],
)
def test_a_file_python_would_decode_otherwise_than_as_utf8_is_refused(text: str) -> None:
    data, problem = python_file_bytes(text)
    assert data == text.encode("utf-8") and problem is not None


@pytest.mark.parametrize(
    "text", ["x = 1\n", "# -*- coding: utf-8 -*-\nx = 'é'\n", "\ufeffx = 1\n", "x = 1\n\n# coding: utf-7\n"]
)
def test_utf8_declared_or_not_is_written_as_judged(text: str) -> None:
    assert python_file_bytes(text) == (text.encode("utf-8"), None)

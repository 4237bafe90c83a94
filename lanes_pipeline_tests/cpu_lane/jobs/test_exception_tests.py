"""An exception test is kept only when its target raises that exception on purpose (issue 54): read on the
sample's mathbits and on the standard library's textwrap, code nobody here wrote."""

from __future__ import annotations

import textwrap
from pathlib import Path

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.jobs.docstring_facts import ANY_EXCEPTION
from lanes_pipeline.cpu_lane.jobs.exception_tests import (
    deliberate_raises,
    expected_exceptions,
    raised_on_purpose,
    unintended_exception_problem,
)

MATHBITS = (Path(sample_repo.__file__).parent / "day3" / "mathbits.py").read_text(encoding="utf-8")
TEXTWRAP = Path(textwrap.__file__).read_text(encoding="utf-8")


def test_a_raise_of_the_body_is_on_purpose_a_wrong_type_call_is_not() -> None:
    assert raised_on_purpose(MATHBITS, "median", "ValueError")
    assert raised_on_purpose(MATHBITS, "median", "Exception")  # a base class of what it raises
    assert not raised_on_purpose(MATHBITS, "median", "TypeError")  # `median(3)`: sorted() of an int
    # gcd's `%` raises ZeroDivisionError on its own, never by a decision of the code.
    assert deliberate_raises(MATHBITS, "gcd") == set()
    assert not raised_on_purpose(MATHBITS, "gcd", "ZeroDivisionError")
    assert not raised_on_purpose(MATHBITS, "no_such_function", "ValueError")


def test_a_raise_in_a_callee_of_the_same_module_counts() -> None:
    # TextWrapper.wrap raises nothing itself; _wrap_chunks, which it calls, raises ValueError on a bad width.
    assert raised_on_purpose(TEXTWRAP, "TextWrapper.wrap", "ValueError")
    assert not raised_on_purpose(TEXTWRAP, "TextWrapper.wrap", "TypeError")


def test_a_raise_the_reading_cannot_name_accepts_any_exception() -> None:
    source = "def again(error):\n    try:\n        run()\n    except Exception:\n        raise\n"
    assert ANY_EXCEPTION in deliberate_raises(source, "again")
    assert raised_on_purpose(source, "again", "TypeError")
    assert unintended_exception_problem("pytest.raises(KeyError)", source, "again") is None


def test_expected_exceptions_are_read_from_each_raises_call() -> None:
    code = (
        "import pytest\n\n\ndef test_a():\n    with pytest.raises(ValueError):\n        f(1)\n"
        "    with pytest.raises((KeyError, builtins.IndexError), match='x'):\n        f(2)\n"
        "    with pytest.raises(ValueError):\n        f(3)\n"
    )
    assert expected_exceptions(code) == ["ValueError", "KeyError", "IndexError"]
    assert expected_exceptions("def test_a():\n    assert f(1) == 2\n") == []
    assert expected_exceptions("not python (") == []


def test_a_test_of_a_wrong_call_is_refused_naming_the_exception_and_the_target() -> None:
    wrong = (
        "import pytest\nfrom mathbits import median\n\n\n"
        "def test_m():\n    with pytest.raises(TypeError):\n        median(3)\n"
    )
    problem = unintended_exception_problem(wrong, MATHBITS, "median")
    assert problem is not None and problem.startswith("expects TypeError but median never raises it")
    right = wrong.replace("TypeError", "ValueError").replace("median(3)", "median([])")
    assert unintended_exception_problem(right, MATHBITS, "median") is None
    assert (
        unintended_exception_problem("def test_m():\n    assert median([1]) == 1\n", MATHBITS, "median")
        is None
    )

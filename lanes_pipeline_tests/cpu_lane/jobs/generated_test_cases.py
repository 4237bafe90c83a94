"""Hand-labelled test cases from real code (issue 54): generated tests a reviewer would merge and ones they
would delete, for functions of the pinned real packages (real_code.py's sdists) and of the shipped sample
repository. Each case is a target, a pytest module as the CPU lane could write it, the label, the stage a
refusal must come from, and why. Several are the shapes issue 54 saw accepted: a TypeError from a
wrong-type call (`median(3)`, `percent(3, '100 %', 100)`) that kills both body mutants.

Refusals are of the kinds the gate can see: a test that checks nothing, an expected exception the target
never raises on purpose (`unintended_exception`, before anything runs), one the guard does not decide (it
survives `remove_raises`), one that fails at the commit. A merge the gate cannot tell from a refusal says
so (`gate_refuses`) and counts against the share of merges accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lanes_pipeline_tests.cpu_lane.real_code import case_source

# A refusal's stage: what the verdict's status and the start of its reason say.
Stage = Literal["trivial", "unintended_exception", "survives_mutant", "fails_on_commit"]


@dataclass(frozen=True)
class TestCase:
    __test__ = False  # a case, not a pytest class

    where: str  # `sample:<day>/<file>` or `<package-version>:<path in the sdist>`
    target: str
    code: str
    label: Literal["merge", "refuse"]
    reason: str
    stage: Stage | None = None  # for a refusal
    # A merge the gate refuses all the same, and the start of the verdict's reason: what it cannot tell.
    gate_refuses: str = ""

    @property
    def path(self) -> str:
        """Where the module lies in the fixture repository: the sdist's `src/` layout flattened."""
        return self.where.split(":", 1)[1].removeprefix("day3/").removeprefix("src/")

    def source(self) -> str:
        return case_source(self.where)


MATH = "sample:day3/mathbits.py"
SEQ = "sample:day3/seqtools.py"
SLUG = "sample:day3/slug.py"
SIX = "six-1.16.0:six.py"
CACHE = "cachetools-5.5.0:src/cachetools/__init__.py"
KEYS = "cachetools-5.5.0:src/cachetools/keys.py"


def _test(imports: str, body: str) -> str:
    return f"import pytest\n\n{imports}\n\n\ndef test_it():\n" + "".join(
        f"    {line}\n" for line in body.splitlines()
    )


TEST_CASES: tuple[TestCase, ...] = (
    # --- merge: values the code computes, exceptions it raises on purpose --------------------------------
    TestCase(MATH, "gcd", _test("from mathbits import gcd", "assert gcd(12, 16) == 4"), "merge", "value"),
    TestCase(
        MATH,
        "factorial",
        _test("from mathbits import factorial", "assert factorial(10) == 3628800"),
        "merge",
        "value",
    ),
    TestCase(
        MATH, "clamp", _test("from mathbits import clamp", "assert clamp(15, 2, 4) == 4"), "merge", "value"
    ),
    TestCase(
        MATH,
        "clamp",
        _test("from mathbits import clamp", "with pytest.raises(ValueError):\n    clamp(1, 5, 2)"),
        "merge",
        "the guard `low > high` raises ValueError",
    ),
    TestCase(
        MATH,
        "median",
        _test("from mathbits import median", "with pytest.raises(ValueError):\n    median([])"),
        "merge",
        "median raises ValueError for an empty list",
    ),
    TestCase(
        MATH,
        "factorial",
        _test("from mathbits import factorial", "with pytest.raises(ValueError):\n    factorial(-1)"),
        "merge",
        "the negative guard",
    ),
    TestCase(
        MATH,
        "round_to_multiple",
        _test(
            "from mathbits import round_to_multiple",
            "assert round_to_multiple(8, 5) == 10\n"
            "with pytest.raises(ValueError):\n    round_to_multiple(7, 0)",
        ),
        "merge",
        "a value and the step guard",
    ),
    TestCase(
        SEQ,
        "chunk",
        _test("from seqtools import chunk", "assert chunk([1, 2, 3], 2) == [[1, 2], [3]]"),
        "merge",
        "value",
    ),
    TestCase(
        SEQ,
        "chunk",
        _test("from seqtools import chunk", "with pytest.raises(ValueError):\n    chunk([1], 0)"),
        "merge",
        "chunk raises ValueError when size < 1",
        gate_refuses="survives the remove_raises mutant of chunk",  # range(0, 1, 0) raises ValueError too
    ),
    TestCase(
        SEQ,
        "chunk",
        _test("from seqtools import chunk", "with pytest.raises(ValueError):\n    chunk([1], -1)"),
        "merge",
        "the same guard, where nothing but the guard raises",
    ),
    TestCase(
        SLUG, "slugify", _test("from slug import slugify", "assert slugify('A b') == 'a-b'"), "merge", "value"
    ),
    TestCase(
        SIX,
        "ensure_str",
        _test("from six import ensure_str", "assert ensure_str(b'abc') == 'abc'"),
        "merge",
        "value",
    ),
    TestCase(
        SIX,
        "ensure_str",
        _test("from six import ensure_str", "with pytest.raises(TypeError):\n    ensure_str(1)"),
        "merge",
        'a TypeError six raises on purpose: `raise TypeError("not expecting type ...")`',
    ),
    TestCase(
        SIX,
        "ensure_binary",
        _test("from six import ensure_binary", "assert ensure_binary('\\xe9') == b'\\xc3\\xa9'"),
        "merge",
        "value: encodes as UTF-8",
    ),
    TestCase(
        SIX,
        "ensure_binary",
        _test("from six import ensure_binary", "with pytest.raises(TypeError):\n    ensure_binary(1.5)"),
        "merge",
        "ensure_binary's own TypeError for a type it does not coerce",
    ),
    TestCase(
        CACHE,
        "LRUCache",
        _test(
            "from cachetools import LRUCache",
            "with pytest.raises(KeyError):\n    LRUCache(maxsize=2).popitem()",
        ),
        "merge",
        "popitem raises KeyError on an empty cache (`raise KeyError(...) from None`)",
    ),
    TestCase(
        CACHE,
        "LRUCache",
        _test(
            "from cachetools import LRUCache",
            "cache = LRUCache(maxsize=2)\ncache['a'] = 1\ncache['b'] = 2\nassert cache.popitem() == ('a', 1)",
        ),
        "merge",
        "value: the least recently used pair",
    ),
    TestCase(
        KEYS,
        "hashkey",
        _test("from cachetools.keys import hashkey", "assert hashkey(1, 2) == (1, 2)"),
        "merge",
        "value",
    ),
    # --- refuse --------------------------------------------------------------------------------------------
    TestCase(
        MATH,
        "median",
        _test("from mathbits import median", "with pytest.raises(TypeError):\n    median(3)"),
        "refuse",
        "issue 54: sorted() of an int, a wrong-type call",
        "unintended_exception",
    ),
    TestCase(
        MATH,
        "percent",
        _test("from mathbits import percent", "with pytest.raises(TypeError):\n    percent(3, '100 %', 100)"),
        "refuse",
        "issue 54: a string where a number goes",
        "unintended_exception",
    ),
    TestCase(
        MATH,
        "gcd",
        _test("from mathbits import gcd", "with pytest.raises(TypeError):\n    gcd('12', 16)"),
        "refuse",
        "abs() of a string",
        "unintended_exception",
    ),
    TestCase(
        MATH,
        "mean",
        _test("from mathbits import mean", "with pytest.raises(ZeroDivisionError):\n    mean([])"),
        "refuse",
        "no `raise` of mean raises it (its guard raises ValueError first)",
        "unintended_exception",
    ),
    TestCase(
        MATH,
        "gcd",
        _test("from mathbits import gcd", "with pytest.raises(ZeroDivisionError):\n    gcd(1, 0) / 0"),
        "refuse",
        "a ZeroDivisionError of the test's own arithmetic, not of gcd",
        "unintended_exception",
    ),
    TestCase(
        SIX,
        "ensure_str",
        _test("from six import ensure_str", "with pytest.raises(TypeError):\n    ensure_str()"),
        "refuse",
        "a missing argument: the guard's removal changes nothing",
        "survives_mutant",
    ),
    TestCase(
        SEQ,
        "chunk",
        _test("from seqtools import chunk", "with pytest.raises(ValueError):\n    chunk([1], 'x')"),
        "refuse",
        "`'x' < 1` raises TypeError: the test fails at the commit",
        "fails_on_commit",
    ),
    TestCase(
        MATH,
        "clamp",
        _test("from mathbits import clamp", "clamp(5, 0, 10)"),
        "refuse",
        "calls the code and checks nothing",
        "trivial",
    ),
    TestCase(
        SLUG,
        "slugify",
        _test("from slug import slugify", "assert slugify('A b') is not False"),
        "refuse",
        "`None is not False` too: no teeth",
        "survives_mutant",
    ),
    TestCase(
        CACHE,
        "LRUCache",
        _test(
            "from cachetools import LRUCache",
            "with pytest.raises(TypeError):\n    LRUCache(maxsize=2).popitem(1)",
        ),
        "refuse",
        "a wrong number of arguments",
        "unintended_exception",
    ),
    TestCase(
        KEYS,
        "hashkey",
        _test(
            "from cachetools.keys import hashkey", "with pytest.raises(TypeError):\n    hash(hashkey([1]))"
        ),
        "refuse",
        "hashing a list fails in the tuple, not by a decision of hashkey",
        "unintended_exception",
    ),
)

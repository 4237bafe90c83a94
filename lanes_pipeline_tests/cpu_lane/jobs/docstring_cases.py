"""Hand-labelled docstring cases from real code (issue 54): what a reviewer would merge and what they would
refuse, for functions of the pinned real packages (real_code.py's sdists) and of the shipped sample
repository. Each case is a symbol, a proposed docstring (None: the symbol's own, as its authors wrote it),
the label, the section a refusal must name (docstring_facts' problems start with it), and why.

Refusals are of the kinds docstring_facts can see: a parameter the signature lacks (or one left out of the
Args section, or documented twice), an exception the code never raises, a Returns section on a procedure or
against the annotation, a summary that restates the name, an existing docstring replaced. Several are the
model's own answers from a `make run` day of the sample (the `artifact` reasons), the first one verbatim as
issue 54 quotes it. Prose that is wrong but consistent with the code (a wrong summary of a real parameter)
is out of these checks' reach and is not labelled here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lanes_pipeline_tests.cpu_lane.real_code import case_source


@dataclass(frozen=True)
class Case:
    where: str  # `sample:<day>/<file>` or `<package-version>:<path in the sdist>`
    symbol: str
    docstring: str | None
    label: Literal["merge", "refuse"]
    reason: str
    section: str = ""  # for a refusal: the section a problem must name (Args, Raises, Returns, ...)

    def source(self) -> str:
        return case_source(self.where)


MATH = "sample:day3/mathbits.py"
SEQ = "sample:day3/seqtools.py"
TEXT = "sample:day3/textstats.py"
CASE = "sample:day3/textcase.py"
SLUG = "sample:day3/slug.py"
CACHE = "cachetools-5.5.0:src/cachetools/__init__.py"
KEYS = "cachetools-5.5.0:src/cachetools/keys.py"
SIX = "six-1.16.0:six.py"
TIMEOUT = "async-timeout-4.0.3:async_timeout/__init__.py"
DECO = "decorator-5.1.1:src/decorator.py"

POWER = "True when `n` is 1, 2, 4, 8, ...; False for 0 and negative numbers."

CASES: tuple[Case, ...] = (
    # --- merge: the authors' own docstrings -------------------------------------------------------------
    Case(MATH, "is_power_of_two", None, "merge", "the correct one-liner issue 54 saw replaced"),
    Case(MATH, "clamp", None, "merge", "real: states the range and the example"),
    Case(MATH, "mean", None, "merge", "real: names the ValueError the body raises"),
    Case(SEQ, "chunk", None, "merge", "real: the ValueError for size < 1 is raised"),
    Case(CACHE, "FIFOCache.popitem", None, "merge", "real one-liner"),
    Case(CACHE, "TTLCache.expire", None, "merge", "real: two-line summary"),
    Case(KEYS, "hashkey", None, "merge", "real one-liner"),
    Case(KEYS, "typedkey", None, "merge", "real one-liner"),
    Case(SIX, "remove_move", None, "merge", "real one-liner"),
    Case(SIX, "ensure_str", None, "merge", "real: prose with lists, no sections"),
    Case(SIX, "_import_module", None, "merge", "real one-liner"),
    Case(TIMEOUT, "Timeout.shift", None, "merge", "real: 'Raise RuntimeError' in prose, which is raised"),
    Case(TIMEOUT, "Timeout.update", None, "merge", "real: several paragraphs"),
    Case(TIMEOUT, "timeout", None, "merge", "real: 'timeout context manager.' says more than the name"),
    Case(DECO, "fix", None, "merge", "real one-liner"),
    Case(DECO, "decorate", None, "merge", "real: prose naming kwsyntax"),
    Case(DECO, "append", None, "merge", "real: a procedure's docstring without Returns"),
    Case(DECO, "FunctionMaker.make", None, "merge", "real method docstring"),
    # --- merge: docstrings a model could write, true to the code -----------------------------------------
    Case(
        TEXT,
        "word_count",
        "Number of words in `text`, as `words` splits it.\n\nArgs:\n    text: the text to count.\n\n"
        "Returns:\n    int: how many words it holds.\n\nExamples:\n"
        "    >>> word_count(\"It's a dog's life\")\n    4",
        "merge",
        "Google style, every fact right, on the sample's one undocumented function",
    ),
    Case(
        MATH,
        "is_power_of_two",
        f"{POWER}\n\nArgs:\n    n: the number to test.\n\nReturns:\n"
        "    bool: whether `n` is a power of two.\n\nExamples:\n    >>> is_power_of_two(8)\n    True\n"
        "    >>> is_power_of_two(0)\n    False",
        "merge",
        "extends the existing docstring, kept verbatim as its start",
    ),
    Case(
        MATH,
        "factorial",
        "n! = 1 * 2 * ... * n, with factorial(0) == 1; raises ValueError for a negative `n`.\n\nArgs:\n"
        "    n: a non-negative integer.\n\nReturns:\n    int: the product.\n\nRaises:\n"
        "    ValueError: when `n` is negative.",
        "merge",
        "extension with a Raises entry the body raises",
    ),
    Case(
        CACHE,
        "Cache.pop",
        "Remove `key` and return its value, or `default` when it is missing.\n\nArgs:\n"
        "    key: the key to remove.\n    default: what to return for a missing key.\n\nReturns:\n"
        "    The removed value, or `default`.\n\nRaises:\n    KeyError: when `key` is missing and no default"
        " is given.",
        "merge",
        "undocumented method; the KeyError is raised",
    ),
    Case(
        CACHE,
        "Cache.get",
        "The value cached under `key`, or `default`.\n\nArgs:\n    key: the key to look up.\n"
        "    default: returned when the key is missing.\n\nReturns:\n    The cached value or `default`.",
        "merge",
        "undocumented method, Google style",
    ),
    Case(
        CACHE,
        "Cache.__getitem__",
        "The value cached under `key`.\n\nArgs:\n    key: the key to look up.\n\nRaises:\n"
        "    KeyError: when the key is missing (from `__missing__`).",
        "merge",
        "the KeyError comes from a method it calls",
    ),
    Case(
        CACHE,
        "Cache.__setitem__",
        "Cache `value` under `key`, evicting items until it fits.\n\nArgs:\n    key: the key.\n"
        "    value: the value to cache.\n\nRaises:\n    ValueError: when the value alone is larger than"
        " maxsize.",
        "merge",
        "a procedure without Returns; its ValueError is raised",
    ),
    Case(
        CACHE,
        "Cache.setdefault",
        "The value under `key`, first storing `default` there when it is missing.\n\nParameters\n----------\n"
        "key : object\n    the key to look up.\ndefault : object\n"
        "    stored and returned for a missing key.\n\n"
        "Returns\n-------\nobject\n    the value now under `key`.",
        "merge",
        "NumPy style, true to the code",
    ),
    Case(
        KEYS,
        "methodkey",
        "Return a cache key for use with cached methods.\n\n:param args: the method's positional arguments.\n"
        ":param kwargs: its keyword arguments.\n:returns: the key, as hashkey builds it.",
        "merge",
        "reST extension; `self` needs no entry",
    ),
    Case(
        SIX,
        "remove_move",
        "Remove item from six.moves.\n\nArgs:\n    name: the move's name.\n\nRaises:\n"
        "    AttributeError: when no move of that name exists.",
        "merge",
        "the AttributeError is raised inside `except KeyError`",
    ),
    Case(
        TIMEOUT,
        "Timeout._do_enter",
        "Enter the context: schedule the deadline.\n\nRaises:\n    RuntimeError: when the timeout was"
        " already entered.",
        "merge",
        "undocumented method; RuntimeError raised",
    ),
    Case(
        DECO,
        "contextmanager",
        "Turn a generator function into a decorator that is also a context manager.\n\nParameters\n"
        "----------\nfunc : callable\n    the generator function.\n\nReturns\n-------\nobject\n"
        "    the context manager factory.",
        "merge",
        "NumPy style on an undocumented function",
    ),
    Case(
        DECO,
        "FunctionMaker.make",
        "Make a new function from a given template and update the signature\n\nRaises:\n"
        "    SyntaxError: when the template holds no function definition.\n    NameError: when it"
        " overrides _func_ or _call_.",
        "merge",
        "extension; both exceptions are raised by the body",
    ),
    # --- refuse ------------------------------------------------------------------------------------------
    Case(
        MATH,
        "is_power_of_two",
        "Returns 1 as the number of times the number is raised to the power of 1\n\nArgs:\n"
        "    n: the number to check.\n    power: the power to raise the number to.\n\nRaises:\n"
        "    TypeError, ValueError\n\nExamples:\n    >>> is_power_of_two(8)\n    True\n"
        "    >>> is_power_of_two(6)\n    False",
        "refuse",
        "issue 54 verbatim: replaces the correct one-liner, phantom `power`, phantom TypeError/ValueError",
        "Docstring",
    ),
    Case(
        MATH,
        "is_power_of_two",
        f"{POWER}\n\nArgs:\n    n: the number.\n    power: the power of two to test against.",
        "refuse",
        "keeps the one-liner but documents `power`, which is no parameter",
        "Args",
    ),
    Case(
        MATH,
        "is_power_of_two",
        f"{POWER}\n\nArgs:\n    n: the number.\n\nRaises:\n    TypeError: when `n` is not an int.",
        "refuse",
        "TypeError is never raised on purpose",
        "Raises",
    ),
    Case(TEXT, "word_count", "Word count.", "refuse", "only restates the name", "Summary"),
    Case(
        TEXT,
        "word_count",
        "Number of words in `text`.\n\nArgs:\n    text: the text.\n\nReturns:\n    str: the count.",
        "refuse",
        "Returns says str, the annotation says int",
        "Returns",
    ),
    Case(
        TEXT,
        "word_count",
        "Number of words in `text`.\n\nArgs:\n    text: the text.\n\nRaises:\n"
        "    ValueError: for empty text.",
        "refuse",
        "the body raises no ValueError",
        "Raises",
    ),
    Case(
        TEXT,
        "word_count",
        "Number of words in `text`.\n\nArgs:\n    text: the text.\n    sep: what separates words.",
        "refuse",
        "documents `sep`, which is no parameter",
        "Args",
    ),
    Case(
        SLUG,
        "slugify",
        "Convert a title into a slug.\n\nArgs:\n    title: the title.\n    max_length: the longest slug.\n"
        "    separator: what joins words.",
        "refuse",
        "replaces the author's docstring",
        "Docstring",
    ),
    Case(
        CACHE,
        "Cache.__delitem__",
        "Remove `key` from the cache.\n\nArgs:\n    key: the key.\n\nReturns:\n    The removed value.",
        "refuse",
        "a procedure: it returns nothing",
        "Returns",
    ),
    Case(
        TIMEOUT,
        "Timeout._reject",
        "Drop the task and cancel the handler.\n\nReturns:\n    bool: whether a handler was cancelled.",
        "refuse",
        "annotated -> None",
        "Returns",
    ),
    Case(
        CACHE,
        "Cache.get",
        "The value under `key`.\n\nArgs:\n    key: the key.\n    fallback: returned for a missing key.",
        "refuse",
        "`fallback` is no parameter and `default` is left out",
        "Args",
    ),
    Case(CACHE, "Cache.setdefault", "Setdefault.", "refuse", "only restates the name", "Summary"),
    Case(DECO, "contextmanager", "Context manager.", "refuse", "only restates the name", "Summary"),
    Case(CACHE, "Cache.__missing__", "Missing.", "refuse", "only restates the name", "Summary"),
    Case(
        DECO,
        "append",
        "Append ``a`` to the list of the virtual ancestors, unless it is already\nincluded.\n\nArgs:\n"
        "    a: the class.\n    vancestors: the list of ancestors.\n\nReturns:\n    list: the updated list.",
        "refuse",
        "append changes the list in place and returns nothing",
        "Returns",
    ),
    Case(
        SIX,
        "ensure_str",
        "Coerce *s* to `str`.\n\nRaises:\n    ValueError: when `s` cannot be decoded.",
        "refuse",
        "replaces the author's docstring, and the body raises TypeError, not ValueError",
        "Raises",
    ),
    Case(
        SEQ,
        "chunk",
        "`items` split into consecutive lists of `size`, the last one possibly shorter.\n\n"
        "chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]; raises ValueError when `size` < 1.\n\n"
        "Raises:\n    TypeError: when `items` is not a list.",
        "refuse",
        "TypeError from a wrong-type call is not raised on purpose",
        "Raises",
    ),
    Case(
        TIMEOUT,
        "Timeout._do_enter",
        "Enter the context.\n\nRaises:\n    ValueError: when the state is wrong.",
        "refuse",
        "the body raises RuntimeError, never ValueError",
        "Raises",
    ),
    Case(
        SIX,
        "_add_doc",
        "Add documentation to a function.\n\nArgs:\n    func: the function.\n    doc: its docstring.\n\n"
        "Returns:\n    The function, documented.",
        "refuse",
        "sets an attribute and returns nothing",
        "Returns",
    ),
    Case(
        MATH,
        "median",
        "Return the smallest number that is a fraction of 100.\n\nArgs:\n    values: a list of floats\n\n"
        "Returns:\n    The smallest number that is a fraction of 100.\n\nRaises:\n"
        "    ValueError: If the input is not a list of floats.",
        "refuse",
        "artifact: replaces the correct docstring with a wrong one",
        "Docstring",
    ),
    Case(
        CASE,
        "truncate",
        "Returns the truncated string of the given width.\n\nArgs:\n    text: the original text.\n"
        "    width: the maximum width of the truncated string.\n    suffix: the suffix to be added to the"
        " truncated string.\n\nReturns:\n    The truncated string with the specified width.\n\nRaises:\n"
        "    ValueError: If the width is less than or equal to the maximum width.",
        "refuse",
        "artifact: a phantom ValueError (and it replaces the author's docstring)",
        "Raises",
    ),
    Case(
        SEQ,
        "interleave",
        "Returns the next smaller item from the list.\n\nArgs:\n    first: the first item of a list.\n"
        "    second: the second item of a list.\n\nReturns:\n    the next item of the list.\n\nRaises:\n"
        "    ValueError: The list is not empty.",
        "refuse",
        "artifact: a phantom ValueError",
        "Raises",
    ),
    Case(
        MATH,
        "lcm",
        "This operation\nreturns a negative 1\n\nArgs:\n    a: a 3-element tuple.\n    b: an integer.\n"
        "    z: zeroth integer.\nReturns:\n    a: a 3-element tuple.\n    b: a 3-element tuple.",
        "refuse",
        "artifact: documents `z`, which is no parameter",
        "Args",
    ),
    Case(
        TEXT,
        "words",
        "Return the number of words in the input text.\n\nArgs:\n    text: the text that contains the text to"
        " be processed.\n    text: the text to be processed.\n    words: a list of words to be processed.",
        "refuse",
        "artifact: `text` twice and `words`, which is no parameter",
        "Args",
    ),
    Case(
        SEQ,
        "chunk",
        "Converts a list of items into a chunk of size size.\n\nArgs:\n    items: a list of items to be"
        " chunked.\n    len: a list of items to be chunked.\n    size: a number that will be used to"
        " determine the size of the chunk.",
        "refuse",
        "artifact: documents `len`, which is no parameter",
        "Args",
    ),
    Case(
        CACHE,
        "Cache.pop",
        "Remove `key` and return its value.\n\nParameters\n----------\nkey : object\n    the key.\n"
        "value : object\n    the value to remove.\n",
        "refuse",
        "NumPy style: `value` is no parameter, `default` is left out",
        "Args",
    ),
    Case(
        KEYS,
        "hashkey",
        "Return a cache key for the specified hashable arguments.\n\n:raises TypeError: when an argument"
        " is unhashable.",
        "refuse",
        "hashkey builds a tuple and raises nothing; the hash is taken later",
        "Raises",
    ),
    Case(
        TIMEOUT,
        "Timeout.expired",
        "Is timeout expired during execution?\n\nReturns:\n    float: the time left.",
        "refuse",
        "Returns says float, the annotation says bool",
        "Returns",
    ),
    Case(
        MATH,
        "gcd",
        "Greatest common divisor of `a` and `b`, always >= 0, by Euclid's algorithm: gcd(12, -18) == 6.\n\n"
        "Args:\n    a: an integer.\n\nReturns:\n    int: the divisor.",
        "refuse",
        "an Args section that leaves `b` out",
        "Args",
    ),
)

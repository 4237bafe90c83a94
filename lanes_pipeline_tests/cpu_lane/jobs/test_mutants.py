"""Mutants: the target's body replaced, the rest of the file byte-identical; a good test kills them."""

from __future__ import annotations

import ast
import difflib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.jobs.mutants import MutationError, mutants, mutate, remove_raises

TEXTWRAP = Path(textwrap.__file__).read_text(encoding="utf-8")
SLUG = (Path(sample_repo.__file__).parent / "day3" / "slug.py").read_text(encoding="utf-8")


def changed_lines(before: str, after: str) -> list[str]:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("---", "+++"))]


def test_a_function_body_is_replaced_and_its_docstring_and_every_other_line_stay() -> None:
    raising, returning = mutants(TEXTWRAP, "dedent")
    assert raising.kind == "raise_not_implemented" and returning.kind == "return_none"
    for mutant, statement in ((raising, "raise NotImplementedError"), (returning, "return None")):
        tree = ast.parse(mutant.source)
        dedent = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "dedent")
        assert ast.get_docstring(dedent) == ast.get_docstring(
            next(n for n in ast.parse(TEXTWRAP).body if getattr(n, "name", "") == "dedent")
        )
        assert [ast.unparse(s) for s in dedent.body[1:]] == [statement]
        original_lines = TEXTWRAP.splitlines()
        start, end = dedent.lineno, dedent.end_lineno
        assert mutant.source.splitlines()[: start - 1] == original_lines[: start - 1]
        tail = len(mutant.source.splitlines()) - end
        assert mutant.source.splitlines()[end:] == original_lines[len(original_lines) - tail :]
        assert all(line.startswith("-") for line in changed_lines(TEXTWRAP, mutant.source)[:-1])


def test_decorators_comments_and_unicode_columns_survive() -> None:
    source = (
        "import functools\n\n\n@functools.cache\ndef f(a):  # keep me\n    '''Doc é.'''\n"
        "    s = 'é'; t = 2\n    @functools.wraps(f)\n    def g(): pass\n    return s * a  # tail\n\n\n"
        "def h(): 'doc'\n"
    )
    mutant = mutate(source, "f", "return_none")
    assert mutant.source == source.replace(
        "    s = 'é'; t = 2\n    @functools.wraps(f)\n    def g(): pass\n    return s * a  # tail",
        "    return None  # tail",
    )
    assert mutate(source, "h", "raise_not_implemented").source.endswith(
        "def h(): 'doc'; raise NotImplementedError\n"
    )
    only_doc = "def k():\n    '''Only a docstring.'''\n"
    assert mutate(only_doc, "k", "return_none").source == only_doc + "    return None\n"


def test_a_class_mutates_each_public_method_and_a_method_target_only_that_one() -> None:
    whole = mutate(TEXTWRAP, "TextWrapper", "raise_not_implemented")
    assert whole.methods == ["TextWrapper.wrap", "TextWrapper.fill"]
    one = mutate(TEXTWRAP, "TextWrapper.fill", "return_none")
    assert one.methods == ["TextWrapper.fill"]
    assert len(changed_lines(TEXTWRAP, one.source)) == 2  # one line out, one line in
    with pytest.raises(MutationError, match="no 'nothing'"):
        mutate(TEXTWRAP, "nothing", "return_none")
    with pytest.raises(MutationError, match="does not parse"):
        mutate("def f(:\n", "f", "return_none")


CONTEXT_MANAGER = """class Opened:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        return False

    def _private(self):
        return 1


class Empty:
    name = "empty"
"""


def test_a_class_with_only_dunder_methods_mutates_those_and_one_without_methods_is_named() -> None:
    # Found on a real package (CI, 2026-12-01): a context manager class stopped the whole day's step.
    whole = mutate(CONTEXT_MANAGER, "Opened", "return_none")
    assert whole.methods == ["Opened.__init__", "Opened.__enter__", "Opened.__exit__"]
    with pytest.raises(MutationError, match="class 'Empty' has no method to mutate"):
        mutate(CONTEXT_MANAGER, "Empty", "return_none")


GOOD_TEST = """from slug import slugify


def test_slugify():
    assert slugify("Hello, World!", max_length=10) == "hello-worl"
"""
TRUTHY_TEST = """from slug import slugify


def test_slugify():
    slugify("Hello, World!")
"""


def run_pytest(folder: Path) -> int:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        cwd=folder,
        capture_output=True,
        timeout=60,
    ).returncode


def test_a_good_test_passes_on_the_original_and_fails_on_both_mutants_a_weak_one_survives(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_slug_generated.py").write_text(GOOD_TEST, encoding="utf-8")
    (tmp_path / "slug.py").write_text(SLUG, encoding="utf-8")
    assert run_pytest(tmp_path) == 0
    for mutant in mutants(SLUG, "slugify"):
        (tmp_path / "slug.py").write_text(mutant.source, encoding="utf-8")
        assert run_pytest(tmp_path) == 1, mutant.kind
    (tmp_path / "test_slug_generated.py").write_text(TRUTHY_TEST, encoding="utf-8")
    return_none = mutate(SLUG, "slugify", "return_none")
    (tmp_path / "slug.py").write_text(return_none.source, encoding="utf-8")
    assert run_pytest(tmp_path) == 0  # a test without an assertion does not kill the mutant


MATHBITS = (Path(sample_repo.__file__).parent / "day3" / "mathbits.py").read_text(encoding="utf-8")


def test_remove_raises_makes_each_raise_of_the_target_pass_and_changes_nothing_else() -> None:
    mutant = remove_raises(MATHBITS, "median")
    assert mutant.kind == "remove_raises" and mutant.methods == ["median"]
    assert changed_lines(MATHBITS, mutant.source) == [
        '-        raise ValueError("median of an empty list")',
        "+        pass",
    ]
    with pytest.raises(MutationError, match="'gcd' has no `raise` statement to remove"):
        remove_raises(MATHBITS, "gcd")


def test_remove_raises_reaches_the_callees_of_the_module_that_raise() -> None:
    # TextWrapper.wrap raises nothing itself: the ValueErrors of _wrap_chunks, which it calls, go.
    mutant = remove_raises(TEXTWRAP, "TextWrapper.wrap")
    assert "_wrap_chunks" in mutant.methods and "wrap" not in mutant.methods
    removed = [line for line in changed_lines(TEXTWRAP, mutant.source) if line.startswith("-")]
    assert removed and all("raise ValueError" in line for line in removed)
    assert ast.parse(mutant.source)  # still Python

"""Symbols as the unit of work, on code nobody here wrote: the stdlib's textwrap and shlex, and the sample
repository's modules."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.repos.symbols import (
    all_symbols,
    diff_scans,
    extract_symbols,
    index_repo,
    reference_counts,
    scan_repo,
)

TEXTWRAP = Path(textwrap.__file__).read_text(encoding="utf-8")
SHLEX = Path(shlex.__file__).read_text(encoding="utf-8")
DAY3 = Path(sample_repo.__file__).parent / "day3"


def sample_sources() -> dict[str, str]:
    return {p.relative_to(DAY3).as_posix(): p.read_text(encoding="utf-8") for p in DAY3.rglob("*.py")}


def by_name(scan):
    return {s.name: s for s in scan.symbols}


def test_functions_and_small_classes_are_whole_symbols_with_line_ranges_and_source() -> None:
    scan = extract_symbols("textwrap.py", TEXTWRAP, max_class_lines=10_000)
    symbols = by_name(scan)
    assert scan.error is None and scan.module == "textwrap"
    assert list(symbols) == ["TextWrapper", "wrap", "fill", "shorten", "dedent", "indent"]
    dedent = symbols["dedent"]
    lines = TEXTWRAP.splitlines()
    assert dedent.kind == "function" and lines[dedent.start_line - 1].startswith("def dedent(")
    assert dedent.source.rstrip("\n") == "\n".join(lines[dedent.start_line - 1 : dedent.end_line])
    assert symbols["TextWrapper"].kind == "class" and "def _wrap_chunks" in symbols["TextWrapper"].source
    assert dedent.imports == ["import re"]


def test_a_large_class_is_split_by_method_and_each_method_keeps_the_class_header() -> None:
    symbols = by_name(extract_symbols("textwrap.py", TEXTWRAP, max_class_lines=60))
    assert "TextWrapper" not in symbols
    method = symbols["TextWrapper.wrap"]
    assert method.kind == "method" and method.import_name == "TextWrapper"
    assert method.class_header.startswith("class TextWrapper:")
    assert "unicode_whitespace_trans" in method.class_header  # class-level attributes stay with the header
    assert "def wrap" not in method.class_header and method.source.lstrip().startswith("def wrap(self, text)")
    # What `wrap` calls on self is shown as signature + docstring, not as code.
    assert any("def _split_chunks(self, text)" in c for c in method.callees)
    assert not any("def wrap(" in c.split("\n", 2)[1] for c in method.callees)


def test_callees_in_the_same_module_and_in_other_modules_of_the_repository() -> None:
    sources = sample_sources()
    scans = {s.path: s for s in scan_repo(sources)}
    unique = by_name(scans["slug.py"])["unique_slug"]
    assert unique.module == "slug"
    assert len(unique.callees) == 1 and unique.callees[0].startswith("# slug\ndef slugify(title: str")
    assert "ASCII letters and digits" in unique.callees[0]  # its docstring
    # A test module calls into slug: with the repository index its callees name the real definitions.
    tests = [s for s in all_symbols(scans.values()) if s.path == "tests/test_slug.py"]
    assert tests and any(c.startswith("# slug\ndef slugify") for t in tests for c in t.callees)
    alone = [s for s in extract_symbols("tests/test_slug.py", sources["tests/test_slug.py"]).symbols]
    assert all(not s.callees for s in alone)  # without the index only the same module resolves


def test_module_paths_with_src_layout_packages_and_relative_imports() -> None:
    sources = {
        "src/pkg/__init__.py": "",
        "src/pkg/core.py": "def base(x: int) -> int:\n    '''The base.'''\n    return x\n",
        "src/pkg/api.py": "from .core import base\n\n\ndef top(x):\n    return base(x) + 1\n",
    }
    scans = {s.path: s for s in scan_repo(sources)}
    top = by_name(scans["src/pkg/api.py"])["top"]
    assert top.module == "pkg.api" and scans["src/pkg/__init__.py"].module == "pkg"
    assert top.callees == ["# pkg.core\ndef base(x: int) -> int:\n    '''The base.'''".replace("'''", '"""')]


def test_an_unparseable_file_is_left_out_with_the_syntax_error_line() -> None:
    scan = extract_symbols("broken.py", "def ok():\n    return 1\n\ndef bad(:\n    pass\n")
    assert scan.symbols == [] and scan.error is not None
    assert scan.error.startswith("SyntaxError line 4")
    assert index_repo({"broken.py": "def bad(:\n"}).stubs == {}


def test_editing_one_function_changes_only_its_memo_key_and_the_diff_says_so() -> None:
    before = extract_symbols("shlex.py", SHLEX, max_class_lines=40).symbols
    edited = SHLEX.replace('    return "\'" + s.replace("\'", "\'\\"\'\\"\'") + "\'"', "    return s")
    assert edited != SHLEX
    after = extract_symbols("shlex.py", edited, max_class_lines=40).symbols
    changed = {s.name for s, t in zip(before, after, strict=True) if s.memo_key != t.memo_key}
    assert changed == {"quote"}
    again = extract_symbols("shlex.py", SHLEX, max_class_lines=40).symbols
    assert [s.memo_key for s in again] == [s.memo_key for s in before]  # stable between runs
    renamed = edited.replace("def join(split_command)", "def join_all(split_command)")
    diff = diff_scans(before, extract_symbols("shlex.py", renamed, max_class_lines=40).symbols)
    assert diff.changed == ["shlex.py::quote"]
    assert diff.new == ["shlex.py::join_all"] and diff.removed == ["shlex.py::join"]
    assert "shlex.py::split" in diff.unchanged


def test_an_edited_callee_changes_the_callers_key_through_its_signature() -> None:
    sources = sample_sources()
    before = {s.id: s.memo_key for s in all_symbols(scan_repo(sources))}
    sources["slug.py"] = sources["slug.py"].replace("max_length: int = 40", "max_length: int = 50")
    after = {s.id: s.memo_key for s in all_symbols(scan_repo(sources))}
    changed = {i for i in before if before[i] != after[i]}
    assert {"slug.py::slugify", "slug.py::unique_slug"} <= changed
    assert "textstats.py::words" not in changed


def test_reference_counts_across_the_repository() -> None:
    sources = sample_sources()
    symbols = all_symbols(scan_repo(sources))
    counts = reference_counts(sources, symbols)
    assert counts["textstats.py::words"] >= 3  # called by word_count, top_words, average_word_length
    assert counts["slug.py::slugify"] > counts["slug.py::unique_slug"] >= 1

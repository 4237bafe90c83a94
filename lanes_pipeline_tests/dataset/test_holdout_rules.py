"""Held-out symbols (holdout_rules.py, pure) and a day's held-out functions with their passing tests
(held_out_day.py: git and the sandbox)."""

from __future__ import annotations

import ast
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from lanes_pipeline.dataset.held_out_tasks import HeldOutDay, held_out_of_repo, training_leaks
from lanes_pipeline.dataset.holdout_rules import (
    body_candidate,
    body_request,
    calling_tests,
    fresh_functions,
    held_out_symbols,
    is_held_out,
    leaked,
    mask,
    route,
)
from lanes_pipeline.dataset.writer import Candidate, render
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.repos.scan import body_text, symbols_at
from lanes_pipeline.repos.snapshot import FileEntry, Snapshot
from lanes_pipeline.repos.symbols import all_symbols, scan_repo
from lanes_pipeline.sandbox.isolation import detect_isolation
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline_tests.cpu_lane.fixtures import SHAPES_MODULE, SHAPES_TESTS, shapes_repo


def symbols():
    return all_symbols(scan_repo({"shapes.py": SHAPES_MODULE}))


def shapes_snapshot(
    repo: str, commit: str, day: date = date(2026, 11, 1), previous_commit: str | None = None
) -> Snapshot:
    """The day's snapshot of a repository whose one analysed file is shapes.py."""
    entry = FileEntry(path="shapes.py", blob="0" * 40, size=len(SHAPES_MODULE), language="python")
    return Snapshot(
        repo=repo, day=day, branch="HEAD", commit=commit, previous_commit=previous_commit, files=[entry]
    )


def test_the_held_out_share_is_stable_and_follows_the_percent() -> None:
    found = symbols()
    assert held_out_symbols("r", found, 100) == found and held_out_symbols("r", found, 0) == []
    assert [is_held_out("r", s.id, 50) for s in found] == [is_held_out("r", s.id, 50) for s in found]
    many = all_symbols(scan_repo({"m.py": "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(400))}))
    share = len(held_out_symbols("r", many, 30)) / len(many)
    assert 0.22 < share < 0.38, share


def test_mask_keeps_signature_and_docstring_and_drops_only_held_out_bodies() -> None:
    by_name = {s.name: s for s in symbols()}
    masked = mask(SHAPES_MODULE, [by_name["double"], by_name["shout"]])
    ast.parse(masked)  # still Python
    assert '"""Twice x."""' in masked and "def shout(text: str) -> str:" in masked
    assert "result = x + x" not in masked and "text.upper()" not in masked
    assert "return math.pi * r * r" in masked  # not held out: unchanged


def test_a_body_is_recognised_in_a_file_in_a_code_block_and_in_a_diff() -> None:
    body = body_text({s.name: s for s in symbols()}["double"])
    assert body == "result = x + x\nreturn result"
    diff = (
        "--- a/shapes.py\n+++ b/shapes.py\n@@ -12,3 +12,3 @@\n"
        "-    result = x + x\n-    return result\n+    return 2 * x\n"
    )
    assert leaked(diff, [body])
    assert leaked(f"```python\n{SHAPES_MODULE}```", [body])
    assert not leaked("result = x + x\nreturn 2 * x", [body])
    assert not leaked("return x", ["return x"])  # shorter than MIN_BODY_CHARS: too common to count


def test_route_sends_held_out_rows_to_eval_and_masks_the_rest() -> None:
    by_name = {s.name: s for s in symbols()}
    held = [by_name["double"]]
    about = Candidate(
        task="write_tests",
        repo="r",
        path="shapes.py",
        code=SHAPES_MODULE,
        answer="def test(): ...",
        symbol="double",
    )
    assert route(about, held).held_out and route(about, held).code == SHAPES_MODULE
    other = about.model_copy(update={"symbol": "area"})
    routed = route(other, held)
    assert not routed.held_out and "result = x + x" not in routed.code and "math.pi" in routed.code
    diff = "-    result = x + x\n-    return result\n+    return 2 * x\n"
    proposal = Candidate(task="refactor_diff", repo="r", path="shapes.py", code=SHAPES_MODULE, answer=diff)
    assert route(proposal, held).held_out


def test_calling_tests_finds_the_test_functions_that_name_it() -> None:
    assert calling_tests({"tests/test_shapes.py": SHAPES_TESTS}, "double") == [
        "tests/test_shapes.py::test_double",
        "tests/test_shapes.py::test_broken_on_purpose",
    ]
    assert calling_tests({"tests/test_shapes.py": SHAPES_TESTS, "bad.py": "def ("}, "shout") == [
        "tests/test_shapes.py::test_area_and_shout"
    ]


def test_a_day_keeps_only_held_out_functions_with_tests_that_pass_on_the_real_code(tmp_path: Path) -> None:
    repo, commit = shapes_repo(tmp_path)
    snapshot = shapes_snapshot("r", commit)
    accepted = {"shout": ["from shapes import shout\n\n\ndef test_shout():\n    assert shout('a') == 'A!'\n"]}
    limits = SandboxLimits(runs=1, timeout_s=60)
    split = held_out_of_repo(snapshot, repo, 100, accepted, limits, detect_isolation())
    assert sorted(s.name for s in split.held) == ["area", "double", "shout"]
    # a first day: every function is new; `double` is not taught, a repository test calling it fails
    assert [s.name for s in split.taught] == ["area", "shout"]
    by_name = {f.symbol.name: f for f in split.functions}
    # the deliberately broken repository test is left out; the passing one stays
    assert by_name["double"].repo_tests == ["tests/test_shapes.py::test_double"]
    assert by_name["shout"].repo_tests == ["tests/test_shapes.py::test_area_and_shout"]
    assert by_name["shout"].cpu_tests == accepted["shout"]
    assert (
        by_name["double"].stub.startswith("def double(x: int) -> int:")
        and "Twice x." in by_name["double"].stub
    )


def test_the_leak_check_finds_a_held_out_body_in_a_training_row_and_nothing_else() -> None:
    by_name = {s.name: s for s in symbols()}
    held = HeldOutDay(held_out_percent=50, bodies={"r": {by_name["double"].id: body_text(by_name["double"])}})
    masked = mask(SHAPES_MODULE, [by_name["double"]])
    assert training_leaks(held, [f"Explain this code:\n```python\n{masked}```"]) == []
    leaking = f"Explain this code:\n```python\n{SHAPES_MODULE}```"
    assert training_leaks(held, ["unrelated", leaking]) == ["r: shapes.py::double"]


def test_a_body_row_shows_the_request_and_answers_with_the_users_function() -> None:
    by_name = {s.name: s for s in symbols()}
    row = body_candidate("r", by_name["area"])
    assert row.task == "write_body" and row.symbol == "area" and row.path == "shapes.py"
    assert row.code == body_request(by_name["area"])
    assert "import math" in row.code and row.code.rstrip().endswith('"""Area of a circle of radius r."""')
    assert "math.pi * r * r" not in row.code and "math.pi * r * r" in row.answer
    user = render(row, "sys").messages[1]["content"]
    assert user.startswith("Write the body of `area` in shapes.py. Reply with the whole function")
    # not held out: training, its request unmasked (it shows no body); held out: eval
    assert route(row, [by_name["double"]]) == row.model_copy(update={"held_out": False})
    assert route(row, [by_name["area"]]).held_out


def test_fresh_functions_are_the_new_and_changed_ones_all_on_a_first_day() -> None:
    before = symbols()
    assert [s.name for s in fresh_functions([], before)] == ["area", "double", "shout"]
    added = "\n\nclass Box:\n    pass\n\n\ndef new():\n    return 1\n"
    edited = SHAPES_MODULE.replace("x + x", "2 * x") + added
    after = all_symbols(scan_repo({"shapes.py": edited}))
    assert [s.name for s in fresh_functions(before, after)] == ["double", "new"]  # a class is no body task
    assert fresh_functions(before, before) == []


def test_a_repository_whose_tests_hang_is_recorded_and_gives_no_task(tmp_path: Path) -> None:
    hanging = SHAPES_TESTS + "\n\ndef test_hangs():\n    import time\n    double(1)\n    time.sleep(600)\n"
    when = datetime(2026, 11, 1, 12, tzinfo=UTC)
    files = {"shapes.py": SHAPES_MODULE, "tests/test_shapes.py": hanging}
    commit = build_history(tmp_path / "repo", [CommitSpec(when=when, message="hangs", files=files)])
    snapshot = shapes_snapshot("r", commit)
    limits = SandboxLimits(runs=1, timeout_s=5)
    split = held_out_of_repo(snapshot, tmp_path / "repo", 100, {}, limits, detect_isolation())
    assert split.functions == [] and len(split.held) == 3
    assert split.problem is not None and "gave no report in the sandbox (killed at 5.0 s" in split.problem
    # No verdict is no failure (issue 55): the functions are taught from the snapshot all the same.
    assert [s.name for s in split.taught] == ["area", "double", "shout"] and "shapes.py" in split.files


def test_a_test_that_cannot_run_withholds_nothing_one_that_ran_and_failed_does(tmp_path: Path) -> None:
    """A test module that does not import in the sandbox (the environment lacks a package) gives no verdict
    on the functions it calls; a test that ran and failed keeps its function out (double)."""
    unimportable = "import lanes_not_installed_anywhere\nfrom shapes import area\n\n\ndef test_area():\n"
    unimportable += "    assert area(1.0) > 3\n"
    when = datetime(2026, 11, 1, 12, tzinfo=UTC)
    files = {
        "shapes.py": SHAPES_MODULE,
        "tests/test_shapes.py": SHAPES_TESTS,
        "tests/test_env.py": unimportable,
    }
    commit = build_history(tmp_path / "repo", [CommitSpec(when=when, message="env", files=files)])
    limits = SandboxLimits(runs=1, timeout_s=60)
    split = held_out_of_repo(
        shapes_snapshot("r", commit), tmp_path / "repo", 0, {}, limits, detect_isolation()
    )
    assert split.problem is None
    assert [s.name for s in split.taught] == ["area", "shout"]  # double's calling test ran and failed


def test_an_unchanged_day_teaches_nothing_unless_nothing_was_taught_yet(tmp_path: Path) -> None:
    """A new install's first day may be a day the repository did not change: every function is new to the
    adapter then; on later unchanged days the functions were taught already (they stay in the window)."""
    repo, commit = shapes_repo(tmp_path)
    snapshot = shapes_snapshot("r", commit, day=date(2026, 11, 30), previous_commit=commit)
    limits = SandboxLimits(runs=1, timeout_s=60)
    assert held_out_of_repo(snapshot, repo, 0, {}, limits, detect_isolation()).taught == []
    first = held_out_of_repo(snapshot, repo, 0, {}, limits, detect_isolation(), teach_all=True)
    assert [s.name for s in first.taught] == ["area", "shout"]  # double's calling test fails: not taught


# A class over max_class_lines is taken method by method: each method's source is indented in its file, and
# one holds a string literal whose lines start at column 0 (textwrap.dedent finds nothing to remove there).
_FILLER = "".join(f"    def helper_{i}(self):\n        return {i}\n\n" for i in range(60))
BIG_CLASS = f'''import functools


class Big:
    """A class too large to take whole."""

    def __init__(self, iterable):
        self.items = list(iterable)
        self.banner = """
first line
second line"""

    @functools.total_ordering
    class _Item:
        def __lt__(self, other):
            return id(self) < id(other)

    def one_liner(self): return len(self.items) + 1

    async def fetch(self, key):
        """Fetch one."""
\treturn self.items[key]

{_FILLER}'''.replace("\n\treturn", "\n        return")


def test_methods_of_a_large_class_are_parsed_masked_and_asked_for_like_functions() -> None:
    found = {s.name: s for s in all_symbols(scan_repo({"big.py": BIG_CLASS}, max_class_lines=40))}
    init, fetch, one_liner = found["Big.__init__"], found["Big.fetch"], found["Big.one_liner"]
    assert init.kind == "method" and init.source.startswith("    def __init__")
    assert body_text(init) == 'self.items = list(iterable)\nself.banner = """\nfirst line\nsecond line"""'
    assert body_text(one_liner) == "return len(self.items) + 1"  # the body shares the `def` line
    assert body_text(fetch) == "return self.items[key]"  # async, its docstring left out
    masked = mask(BIG_CLASS, [init, fetch, one_liner])
    ast.parse(masked)
    assert "def one_liner(self): ...  # held out" in masked and '"""Fetch one."""' in masked
    assert "first line" not in masked and "self.items[key]" not in masked
    assert not leaked(masked, [body_text(init), body_text(fetch)])


def test_a_class_whose_body_starts_with_a_decorated_nested_class_is_masked_from_the_decorator() -> None:
    source = BIG_CLASS.replace("class Big:", "class Small:").replace(_FILLER, "")
    small = next(s for s in all_symbols(scan_repo({"s.py": source})) if s.name == "Small")
    code = source.replace('    """A class too large to take whole."""\n\n', "")
    bare = next(s for s in all_symbols(scan_repo({"s.py": code})) if s.name == "Small")
    for symbol, text in ((small, source), (bare, code)):
        masked = mask(text, [symbol])
        ast.parse(masked)  # the decorator went with the body it decorates
        assert "@functools.total_ordering" not in masked and "...  # held out" in masked
    assert body_text(bare).startswith("def __init__(self, iterable):")


def test_a_symbol_the_pipeline_cannot_handle_is_skipped_with_its_reason_and_the_day_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The skip itself, with a symbol made unreadable on purpose (no real one is left after the fixes): the
    repository's other symbols go on, the reason is kept, and its file trains nothing when it is held out."""
    import lanes_pipeline.repos.scan as scan

    real = scan.body_text

    def body_text_failing_on_area(symbol):
        if symbol.name == "area":
            raise IndentationError("unexpected indent (<unknown>, line 1)")
        return real(symbol)

    monkeypatch.setattr(scan, "body_text", body_text_failing_on_area)
    repo, commit = shapes_repo(tmp_path)
    today = symbols_at(repo, commit, {"shapes.py"})
    assert today.skipped == {"shapes.py::area": "IndentationError: unexpected indent (<unknown>, line 1)"}
    assert "shapes.py::area" not in {s.id for s in today.symbols} and len(today.symbols) >= 2
    snapshot = shapes_snapshot("shapes", commit)
    split = held_out_of_repo(snapshot, repo, 100, {}, SandboxLimits(runs=1, timeout_s=60), detect_isolation())
    assert split.skipped == today.skipped and split.unmaskable == ["shapes.py"]
    row = Candidate(task="write_tests", repo="shapes", path="shapes.py", code=SHAPES_MODULE, answer="x")
    assert route(row, split.held, split.unmaskable).held_out  # its body cannot be masked: eval only
    assert not route(row, [], []).held_out


def test_functions_no_test_calls_are_no_problem_and_are_still_taught(tmp_path: Path) -> None:
    """A suite of unittest classes (as cachetools has) calls no function from a top-level test: nothing is
    run, which is not "the tests gave no report", and the day's functions are still taught."""
    tests = "import unittest\n\nfrom shapes import double\n\n\nclass T(unittest.TestCase):\n"
    tests += "    def test_d(self):\n        assert double(2) == 4\n"
    files = {"shapes.py": SHAPES_MODULE, "tests/test_shapes.py": tests}
    when = datetime(2026, 11, 1, 12, tzinfo=UTC)
    commit = build_history(tmp_path / "repo", [CommitSpec(when=when, message="unittest", files=files)])
    snapshot = shapes_snapshot("r", commit)
    limits = SandboxLimits(runs=1, timeout_s=30)
    split = held_out_of_repo(snapshot, tmp_path / "repo", 50, {}, limits, detect_isolation(), teach_all=True)
    assert any(s.kind == "function" for s in split.held)  # a held-out function, with no test calling it
    assert split.problem is None and split.functions == []
    taught = {s.name for s in split.taught}
    assert taught and taught == {s.name for s in symbols() if s.kind == "function"}

"""A symbol's refactor diff stays inside the symbol's lines (symbol_diff.confine_to_symbol), pure: hunks are
placed by their own lines, not by the numbers the model wrote, and a hunk touching any other line is
rejected with the verdict `outside_symbol` and the line it touches."""

from __future__ import annotations

from pathlib import Path

from lanes_pipeline.cpu_lane.jobs.diff_judge import DiffJudge, DiffScope
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.cpu_lane.jobs.rows import RememberedAnswer
from lanes_pipeline.cpu_lane.jobs.symbol_diff import apply_confined, confine_to_symbol, locate
from lanes_pipeline.cpu_lane.jobs.tasks import ParsedDiff, parse_diff
from lanes_pipeline.repos.symbols import Symbol, extract_symbols
from lanes_pipeline.sandbox.safety import unsafe_code_added
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline.store import ArtifactStore

MODULE = '''"""Two functions."""


def first(x):
    total = x + 1
    return total


def second(y):
    doubled = y * 2
    return doubled
'''


def symbol(name: str) -> Symbol:
    return next(s for s in extract_symbols("calc.py", MODULE).symbols if s.name == name)


def diff(*hunks: str) -> ParsedDiff:
    parsed = parse_diff("```diff\n--- a/calc.py\n+++ b/calc.py\n" + "".join(hunks) + "```", "calc.py")
    assert isinstance(parsed, ParsedDiff), parsed
    return parsed


INSIDE_SECOND = (
    "@@ -9,3 +9,2 @@\n def second(y):\n-    doubled = y * 2\n-    return doubled\n+    return y * 2\n"
)


def test_a_hunk_inside_the_symbol_is_kept_and_placed_where_its_lines_are() -> None:
    # The model numbered the hunk wrongly (line 3): its lines are found at line 9, where `second` starts.
    confined = confine_to_symbol(
        diff(INSIDE_SECOND.replace("-9,3 +9,2", "-3,3 +3,2")), MODULE, symbol("second")
    )
    assert isinstance(confined, ParsedDiff)
    assert confined.text.splitlines()[2] == "@@ -9,3 +9,2 @@"
    assert (confined.added, confined.removed) == (1, 2)
    assert confined.text.endswith("+    return y * 2\n")


def test_a_hunk_that_touches_another_symbol_is_rejected() -> None:
    # Right lines of `second`, but the task was `first`: every removed line is outside first's lines 4-6.
    rejected = confine_to_symbol(diff(INSIDE_SECOND), MODULE, symbol("first"))
    assert rejected == ("outside_symbol", "removes line 10, outside the symbol's lines 4-6")


def test_adding_a_line_before_the_symbol_is_outside_it() -> None:
    decorator = "@@ -3,2 +3,3 @@\n \n+@cache\n def first(x):\n"
    why = confine_to_symbol(diff(decorator), MODULE, symbol("first"))
    assert why == ("outside_symbol", "adds a line before line 4, outside the symbol's lines 4-6")


def test_adding_after_the_last_line_of_the_symbol_is_inside_it() -> None:
    tail = "@@ -5,2 +5,3 @@\n     total = x + 1\n     return total\n+    # unreachable\n"
    assert isinstance(confine_to_symbol(diff(tail), MODULE, symbol("first")), ParsedDiff)


def test_a_hunk_whose_lines_are_not_in_the_file_is_rejected() -> None:
    invented = "@@ -5,1 +5,1 @@\n-    total = x + 100\n+    total = 1 + x\n"
    why = confine_to_symbol(diff(invented), MODULE, symbol("first"))
    assert why == ("outside_symbol", "hunk @@ -5 does not match the file's lines")


def test_overlapping_hunks_are_rejected_and_two_hunks_keep_their_offsets() -> None:
    one = "@@ -5,1 +5,1 @@\n-    total = x + 1\n+    total = 1 + x\n"
    assert confine_to_symbol(diff(one, one), MODULE, symbol("first"))[0] == "outside_symbol"
    grow = "@@ -5,1 +5,2 @@\n-    total = x + 1\n+    total = x\n+    total += 1\n"
    last = "@@ -6,1 +7,1 @@\n-    return total\n+    return int(total)\n"
    both = confine_to_symbol(diff(grow, last), MODULE, symbol("first"))
    assert isinstance(both, ParsedDiff)
    assert [line for line in both.text.splitlines() if line.startswith("@@")] == [
        "@@ -5,1 +5,2 @@",
        "@@ -6,1 +7,1 @@",
    ]


def test_locate_prefers_the_occurrence_nearest_the_stated_line() -> None:
    lines = ["a", "b", "a", "b", "c"]
    assert locate(lines, ["a", "b"], 1) == 1 and locate(lines, ["a", "b"], 4) == 3
    assert locate(lines, ["x"], 1) is None


def test_the_confined_diff_applied_gives_the_code_it_makes() -> None:
    confined = confine_to_symbol(diff(INSIDE_SECOND), MODULE, symbol("second"))
    assert isinstance(confined, ParsedDiff)
    made = MODULE.replace("    doubled = y * 2\n    return doubled\n", "    return y * 2\n")
    assert apply_confined(confined, MODULE) == made


def test_a_refactor_that_adds_a_forbidden_call_is_rejected_before_the_sandbox(tmp_path: Path) -> None:
    """Seen with a hostile answer: `__import__("os").system(...)` inside a function fails quietly in the
    sandbox (a status, no exception), every test passed, and the diff became a training row."""
    call = '+    __import__("os").system("touch /tmp/x")\n'
    hostile = INSIDE_SECOND.replace("+    return y * 2\n", call + "+    return y * 2\n")
    hostile = hostile.replace("-9,3 +9,2", "-9,3 +9,3")
    confined = confine_to_symbol(diff(hostile), MODULE, symbol("second"))
    assert isinstance(confined, ParsedDiff)
    assert unsafe_code_added(MODULE, apply_confined(confined, MODULE)) == ["__import__()"]
    assert unsafe_code_added(MODULE, MODULE) == []
    twice = "import os\nos.system('a')\n"
    assert unsafe_code_added(twice, twice + "os.system('b')\n") == ["os.system()"]  # one more counts
    judge = DiffJudge(Memo(ArtifactStore(tmp_path / "artifacts"), "diff_check"), SandboxLimits())
    answer = RememberedAnswer(answer="```diff\n--- a/calc.py\n+++ b/calc.py\n" + hostile + "```")
    scope = DiffScope(symbol=symbol("second"), file_source=MODULE)
    key = "calc.py::second"
    (row,) = judge.rows("r", tmp_path, "0" * 40, [], {key: answer}, {key: scope})
    assert row.verdict == "unsafe_code" and "__import__()" in (row.reason or "") and row.diff is None

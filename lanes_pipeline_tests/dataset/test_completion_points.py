"""Code completion points: a held-out function is cut after its signature and docstring, at lines worth
predicting (never a blank or a closing bracket); the ids are stable; the prompt keeps whole lines from the
left; a held_out.json written before the points existed still loads; the sample repository gives them."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanes_pipeline.dataset.completion_points import CompletionPoint, cut_points, day_points, is_point_line
from lanes_pipeline.dataset.contract import completion_prompt
from lanes_pipeline.dataset.held_out_tasks import (
    HELD_OUT_FILE,
    HELD_OUT_TASKS,
    HeldOutDay,
    completion_of_repo,
    load_held_out,
)
from lanes_pipeline.dataset.holdout_rules import held_out_symbols
from lanes_pipeline.git import git
from lanes_pipeline.repos.sample_repo import ensure_sample_repo
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.repos.symbols import Symbol, extract_symbols
from lanes_pipeline.store import ArtifactStore

SOURCE = '''"""A module."""

import json


def build(name: str, items: list[int]) -> dict:
    """Build a record.

    Long docstring.
    """

    total = sum(
        items,
    )
    record = {
        "name": name,
        "total": total,
    }
    return json.loads(json.dumps([record]))[0]


def short(x): return x


class Box:
    def open(self):
        return 1


@staticmethod
def decorated(a, b):
    # comment first
    return [
        a,
        b,
    ]
'''


def symbols(path: str = "mod.py", source: str = SOURCE) -> dict[str, Symbol]:
    return {s.name: s for s in extract_symbols(path, source).symbols}


def line_of(text: str, source: str = SOURCE) -> int:
    return source.splitlines().index(text) + 1


def test_a_function_is_cut_after_its_docstring_at_lines_worth_predicting() -> None:
    points = cut_points("r", "mod.py", SOURCE, symbols()["build"])
    assert [p.expected for p in points] == [
        "    total = sum(",
        "        items,",
        "    record = {",
        '        "name": name,',
        '        "total": total,',
        "    return json.loads(json.dumps([record]))[0]",
    ]
    assert [p.line for p in points] == [line_of(p.expected) for p in points]
    first = points[0]
    assert first == CompletionPoint(
        id=f"r:complete:mod.py::build:{first.line}",
        repo="r",
        path="mod.py",
        symbol="mod.py::build",
        line=first.line,
        expected="    total = sum(",
    )
    # The decorator and a leading comment: the comment is body, the decorator is not.
    decorated = cut_points("r", "mod.py", SOURCE, symbols()["decorated"])
    expected = ["    # comment first", "    return [", "        a,", "        b,"]
    assert [p.expected for p in decorated] == expected


@pytest.mark.parametrize("line", ["", "   ", ")", "    ]", "}", "    ),", "])", "}:", "    ...", "\t"])
def test_blank_and_closing_bracket_lines_are_no_point(line: str) -> None:
    assert not is_point_line(line)


@pytest.mark.parametrize("line", ["    return x", "    )  # done", "x = (", "    pass", "else:"])
def test_code_lines_are_points(line: str) -> None:
    assert is_point_line(line)


def test_ids_are_stable_and_a_day_comes_in_order_by_function_then_line() -> None:
    held = list(symbols().values())
    sources = {"mod.py": SOURCE, "other.py": "x = 1\n"}
    first, used = day_points("r", reversed(held), sources)
    again, _ = day_points("r", held, sources)
    assert [p.id for p in first] == [p.id for p in again]
    assert [p.symbol for p in first] == sorted(p.symbol for p in first)  # build, decorated: by id
    assert {p.symbol for p in first} == {"mod.py::build", "mod.py::decorated"}  # not the class, not short
    assert used == {"mod.py": SOURCE}  # only the files that hold a point
    assert day_points("r", held, {}) == ([], {})  # no file text: no points


def test_a_function_whose_lines_are_not_the_files_gives_none() -> None:
    build = symbols()["build"]
    moved = SOURCE.replace('"""A module."""\n', '"""A module."""\n\n# a line added above\n')
    assert cut_points("r", "mod.py", moved, build) == []
    assert cut_points("r", "mod.py", SOURCE.replace("total = sum(", "total = max("), build) == []
    assert cut_points("r", "mod.py", SOURCE, symbols()["short"]) == []  # the body shares the def's line
    with pytest.raises(ValueError, match=r"mod\.py::Box is a class"):
        cut_points("r", "mod.py", SOURCE, symbols()["Box"])
    with pytest.raises(ValueError, match=r"mod\.py::build is in mod\.py, not in other\.py"):
        cut_points("r", "other.py", SOURCE, build)


def test_the_prompt_names_the_file_and_cuts_whole_lines_from_the_left() -> None:
    prefix = "import os\n\ndef f():\n    a = 1\n"
    # The prompt stops before the newline of the line above the cut: the model writes it, merged with the
    # next line's indentation into one token.
    assert completion_prompt("pkg/m.py", prefix, 1000) == "# pkg/m.py\n" + prefix.removesuffix("\n")
    assert completion_prompt("pkg/m.py", prefix, len("    a = 1\n")) == "# pkg/m.py\n    a = 1"
    # One character short of the last two lines: only the last, never part of a line.
    two = len("def f():\n    a = 1\n")
    assert completion_prompt("m.py", prefix, two - 1) == "# m.py\n    a = 1"
    assert completion_prompt("m.py", prefix, two) == "# m.py\ndef f():\n    a = 1"
    assert completion_prompt("m.py", prefix, 3) == "# m.py"  # no whole line fits
    assert completion_prompt("m.py", "", 100) == "# m.py"  # a cut at the first line
    with pytest.raises(ValueError, match=r"m\.py: the text before the cut must end with a newline"):
        completion_prompt("m.py", "def f():\n    a", 100)
    with pytest.raises(ValueError, match="context_chars must be >= 0"):
        completion_prompt("m.py", prefix, -1)


def test_an_older_held_out_json_loads_without_points_and_a_new_one_reads_back(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.write_json(HELD_OUT_TASKS, "2026-11-01", HELD_OUT_FILE, {"held_out_percent": 50, "functions": []})
    old = load_held_out(store, "2026-11-01")
    assert old.completion_points == [] and old.sources == {}
    points, sources = day_points("r", symbols().values(), {"mod.py": SOURCE})
    day = HeldOutDay(held_out_percent=50, completion_points=points, sources={"r": sources})
    store.write_json(HELD_OUT_TASKS, "2026-11-02", HELD_OUT_FILE, day.model_dump(mode="json"))
    assert load_held_out(store, "2026-11-02") == day


def test_the_sample_repository_gives_points_in_every_held_out_function(tmp_path: Path) -> None:
    repo = ensure_sample_repo(tmp_path / "sample_repo")
    commit = git(repo, "rev-parse", "HEAD").decode().strip()
    held = held_out_symbols("sample", symbols_at(repo, commit).symbols, 50)
    points, sources = completion_of_repo("sample", repo, commit, held)
    functions = {s.id for s in held if s.kind == "function"}
    assert functions and {p.symbol for p in points} == functions
    assert len({p.id for p in points}) == len(points)
    for point in points:
        assert sources[point.path].splitlines()[point.line - 1] == point.expected
        assert is_point_line(point.expected) and '"""' not in point.expected
    assert completion_of_repo("sample", repo, commit, []) == ([], {})

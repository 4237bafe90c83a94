"""Held-out repository tasks (repo_tasks.py): the prompt, splicing an answer in place of the real function,
and the sandbox's verdict with the tests that call it. No LLM: the answers are written here."""

from __future__ import annotations

import ast
from datetime import date
from pathlib import Path

import pytest

from lanes_pipeline.dataset.body_check import replacement, splice
from lanes_pipeline.dataset.held_out_tasks import HeldOutDay, held_out_of_repo, load_held_out
from lanes_pipeline.dataset.holdout_rules import HeldOutFunction, body_candidate
from lanes_pipeline.dataset.writer import render
from lanes_pipeline.gpu_lane.repo_tasks import body_task, day_tasks, judge_body
from lanes_pipeline.repos.snapshot import FileEntry, Snapshot
from lanes_pipeline.sandbox.isolation import detect_isolation
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.cpu_lane.fixtures import SHAPES_MODULE, shapes_repo

LIMITS = SandboxLimits(runs=1, timeout_s=20)


@pytest.fixture(scope="module")
def functions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HeldOutFunction]:
    repo, commit = shapes_repo(tmp_path_factory.mktemp("shapes"))
    snapshot = Snapshot(
        repo="r",
        day=date(2026, 11, 1),
        branch="HEAD",
        commit=commit,
        files=[FileEntry(path="shapes.py", blob="0" * 40, size=len(SHAPES_MODULE), language="python")],
    )
    found = held_out_of_repo(snapshot, repo, 100, {}, LIMITS, detect_isolation()).functions
    return {f.symbol.name: f for f in found}


def test_the_prompt_is_what_an_editor_sends_for_a_body(functions: dict[str, HeldOutFunction]) -> None:
    task = body_task(functions["double"], "You are careful.")
    assert task.name == "r:body:shapes.py::double" and task.system == "You are careful."
    assert "def double(x: int) -> int:" in task.prompt and "Twice x." in task.prompt
    assert "import math" in task.prompt  # the module's imports are context
    assert "result = x + x" not in task.prompt  # the body is what is asked for
    # a "write_body" training row about another function asks in exactly this form
    row = render(body_candidate("r", functions["double"].symbol), "You are careful.")
    assert row.messages[1]["content"] == task.prompt


def test_replacement_takes_the_named_function_and_its_imports_only() -> None:
    answer = (
        "Here:\n```python\nimport operator\n\ndef helper():\n    pass\n\n"
        "def double(x):\n    return operator.mul(x, 2)\n```"
    )
    new = replacement(answer, "double")
    assert new is not None and new.startswith("import operator\n") and "def helper" not in new
    assert replacement("```python\ndef triple(x):\n    return 3 * x\n```", "double") is None
    assert replacement("```python\ndef double(x:\n```", "double") is None


def test_splice_replaces_exactly_the_function_lines(functions: dict[str, HeldOutFunction]) -> None:
    spliced = splice(SHAPES_MODULE, functions["double"], "def double(x: int) -> int:\n    return 2 * x\n")
    tree = ast.parse(spliced)
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["area", "double", "shout"]
    assert "result = x + x" not in spliced and "return math.pi * r * r" in spliced


def test_the_sandbox_decides_each_answer(functions: dict[str, HeldOutFunction]) -> None:
    double = functions["double"]
    right = judge_body(double, "```python\ndef double(x: int) -> int:\n    return x * 2\n```", LIMITS)
    assert right.passed, right.reason
    wrong = judge_body(double, "```python\ndef double(x: int) -> int:\n    return x + 1\n```", LIMITS)
    assert not wrong.passed and "failed" in wrong.reason
    hangs = "```python\ndef double(x: int) -> int:\n    while True:\n        pass\n```"
    slow = judge_body(double, hangs, LIMITS.model_copy(update={"timeout_s": 5}))
    assert not slow.passed and "did not run" in slow.reason
    prose = judge_body(double, "Double the number.", LIMITS)
    assert not prose.passed and "no parseable" in prose.reason


def test_held_out_tasks_round_trip_through_the_store(
    functions: dict[str, HeldOutFunction], tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"held_out_tasks has no partition 2026-11-01"):
        load_held_out(store, "2026-11-01")
    day = HeldOutDay(held_out_percent=100, functions=list(functions.values()))
    store.write_json("held_out_tasks", "2026-11-01", "held_out.json", day.model_dump(mode="json"))
    loaded = load_held_out(store, "2026-11-01")
    assert loaded == day
    assert [f.symbol.name for f in day_tasks(loaded, 2)] == ["area", "double"]
    store.write_json("held_out_tasks", "2026-11-02", "held_out.json", {"functions": "nope"})
    with pytest.raises(ValueError, match=r"2026-11-02/held_out\.json"):
        load_held_out(store, "2026-11-02")

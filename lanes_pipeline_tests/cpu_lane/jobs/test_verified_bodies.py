"""Verified bodies (jobs/verified_bodies.py): which functions are sampled for, the request they are asked in,
and the sandbox's verdict on each body. No LLM: the answers are written here, as a sampling lane could give
them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from lanes_pipeline.cpu_lane.jobs.verified_bodies import (
    body_requests,
    body_targets,
    gutted,
    judge_target,
    normal_form,
)
from lanes_pipeline.dataset.holdout_rules import HeldOutFunction, is_held_out
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.gpu_lane.repo_tasks import body_task
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.sandbox.isolation import detect_isolation
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline_tests.cpu_lane.fixtures import shapes_repo

LIMITS = SandboxLimits(runs=1, timeout_s=20)
LENIENT_TESTS = """from shapes import shout


def test_shout_does_not_crash_the_caller():
    try:
        shout("hi")
    except Exception:
        pass
"""


def targets_of(
    repo: Path, commit: str, percent: int, accepted: dict[str, list[str]]
) -> list[HeldOutFunction]:
    today = symbols_at(repo, commit, ["shapes.py"])
    return body_targets("r", repo, commit, today.symbols, today.test_sources, accepted, percent)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, HeldOutFunction]:
    repo, commit = shapes_repo(tmp_path_factory.mktemp("shapes"))
    return {f.symbol.name: f for f in targets_of(repo, commit, 0, {})}


def test_targets_are_functions_with_tests_that_are_not_held_out(tmp_path: Path) -> None:
    repo, commit = shapes_repo(tmp_path)
    found = targets_of(repo, commit, 0, {"shout": ["def test_more():\n    pass\n"]})
    assert [f.symbol.name for f in found] == ["area", "double", "shout"]
    calling = ["tests/test_shapes.py::test_double", "tests/test_shapes.py::test_broken_on_purpose"]
    assert found[1].repo_tests == calling  # the one failing on the real code does not judge (judge_target)
    assert found[2].cpu_tests == ["def test_more():\n    pass\n"]
    assert (
        targets_of(repo, commit, 100, {}) == []
    )  # a held-out body is what the judge asks for: never sampled
    half = [f.symbol.id for f in targets_of(repo, commit, 50, {})]
    assert all(not is_held_out("r", symbol, 50) for symbol in half)


def test_the_request_is_the_repository_task_word_for_word(shapes: dict[str, HeldOutFunction]) -> None:
    double = shapes["double"]
    requests = body_requests(double, "You are careful.", samples=3, temperature=0.8, max_tokens=200)
    task = body_task(double, "You are careful.")
    assert [r.id for r in requests] == [
        "r:shapes.py::double#s0",
        "r:shapes.py::double#s1",
        "r:shapes.py::double#s2",
    ]
    assert [r.seed for r in requests] == [0, 1, 2] and {r.temperature for r in requests} == {0.8}
    assert [(m.role, m.content) for m in requests[0].messages] == [
        ("system", task.system),
        ("user", task.prompt),
    ]
    with pytest.raises(ValueError, match="temperature above 0"):
        body_requests(double, "s", samples=2, temperature=0.0, max_tokens=200)


def test_gutted_keeps_the_signature_and_docstring_and_normal_form_ignores_layout() -> None:
    source = '@cache\ndef double(x: int) -> int:\n    """Twice x."""\n    return x + x\n'
    assert (
        gutted(source)
        == '@cache\ndef double(x: int) -> int:\n    """Twice x."""\n    raise NotImplementedError\n'
    )
    assert normal_form(source) == normal_form("@cache\ndef double(x:int)->int:\n    return (x + x)  # sum\n")
    assert normal_form(source) != normal_form("@cache\ndef double(x: int) -> int:\n    return 2 * x\n")
    with pytest.raises(ValueError, match="not a function"):
        gutted("X = 1\n")


def test_each_sample_gets_the_sandbox_verdict(shapes: dict[str, HeldOutFunction]) -> None:
    answers = [
        (0, "```python\ndef double(x: int) -> int:\n    return x * 2\n```"),
        (1, '```python\ndef double(x: int) -> int:\n    """Two x."""\n    return x * 2\n```'),
        (2, "```python\ndef double(x: int) -> int:\n    return x + 1\n```"),
        (3, "Double it."),
        (4, None),
        (
            5,
            '```python\ndef double(x: int) -> int:\n    """Twice x."""\n'
            + "    result = x + x\n    return result\n```",
        ),
    ]
    rows = judge_target(shapes["double"], answers, LIMITS, detect_isolation())
    verdicts = [(r.sample, r.verdict) for r in rows]
    assert verdicts == [
        (None, "real"),
        (0, "accepted"),
        (1, "duplicate"),
        (2, "failed"),
        (3, "no_def"),
        (4, "no_def"),
        (5, "duplicate"),
    ]
    assert rows[0].body is not None and "result = x + x" in rows[0].body and rows[0].trains
    assert rows[1].body == "def double(x: int) -> int:\n    return x * 2\n" and rows[1].trains
    assert rows[2].reason == "the same body as sample 0" and not rows[2].trains
    assert rows[3].reason.startswith("1 test(s) failed: tests/test_shapes.py::test_double")
    assert rows[0].tests == 1  # test_broken_on_purpose fails on the real code: it judges nothing
    assert rows[5].reason == "the request failed" and rows[6].reason == "the same body as the real one"
    assert {r.request for r in rows} == {rows[0].request} and "Twice x." in rows[0].request


def test_tests_that_pass_on_a_gutted_body_judge_nothing(tmp_path: Path) -> None:
    when = datetime(2026, 11, 1, 12, tzinfo=UTC)
    files = {
        "shapes.py": 'def shout(text):\n    return text.upper() + "!"\n',
        "tests/test_shapes.py": LENIENT_TESTS,
    }
    commit = build_history(tmp_path / "repo", [CommitSpec(when=when, message="lenient", files=files)])
    [shout] = targets_of(tmp_path / "repo", commit, 0, {})
    answers = [(0, "```python\ndef shout(text):\n    return 42\n```")]
    rows = judge_target(shout, answers, LIMITS, detect_isolation())
    assert [(r.sample, r.verdict) for r in rows] == [(None, "untestable"), (0, "untestable")]
    assert "pass with the body gutted" in rows[0].reason and not any(r.trains for r in rows)

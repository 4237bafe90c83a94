"""Regression oracles: proposed calls parsed from answers, observed in the sandbox, written as tests that
kill the mutants of the sample repository's real functions."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.jobs.mutants import mutants
from lanes_pipeline.cpu_lane.jobs.oracles import (
    Observation,
    observe_calls,
    oracle_test_file,
    parse_calls,
    probe_script,
    read_observations,
)
from lanes_pipeline.cpu_lane.jobs.teeth import kills_mutants
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.sandbox.isolation import detect_isolation, judge_test_file, open_sandbox
from lanes_pipeline.settings import SandboxLimits

DAY3 = Path(sample_repo.__file__).parent / "day3"
SLUG = (DAY3 / "slug.py").read_text(encoding="utf-8")
TEXTSTATS = (DAY3 / "textstats.py").read_text(encoding="utf-8")

ANSWER = """Some inputs worth trying:
```python
from slug import slugify
slugify("Hello, World!", max_length=10)
assert slugify("a  b") == "a-b"
>>> slugify("x y", separator="_")
import os
os.system("id")
slugify(title)
slugify("a" * 10**9)
slugify(**{"title": "x"})
slugify("x", __class__=1)
def test_it():
    assert slugify("Éclair") == "eclair"
slugify("Hello, World!", max_length=10)
```
"""


def test_parse_calls_keeps_plain_literal_calls_of_the_target_only() -> None:
    parsed = parse_calls(ANSWER, "slugify")
    assert parsed.calls == [
        "slugify('Hello, World!', max_length=10)",
        "slugify('a  b')",
        "slugify('x y', separator='_')",
        "slugify('Éclair')",
    ]
    reasons = "\n".join(parsed.rejected)
    assert "not a call of slugify: os.system('id')" in reasons
    assert "names a variable (title)" in reasons
    assert "arithmetic in an argument" in reasons
    assert "`**` argument" in reasons and "dunder keyword __class__" in reasons


def test_parse_calls_of_methods_bare_lines_and_prose() -> None:
    answer = "Try Counter([1, 1]).most_common(1) and also\nCounter.fromkeys('ab')\nprint(Counter().total())"
    parsed = parse_calls(answer, "Counter.most_common")
    assert parsed.calls == ["Counter([1, 1]).most_common(1)"]
    assert parse_calls("words('a b', n=set())\nwords(x.y)", "words").calls == ["words('a b', n=set())"]
    # An expected value written without its `assert`: the call is the proposal, the guess is dropped.
    assert parse_calls("factorial(1) == 1\nfactorial(3) == 7", "factorial").calls == [
        "factorial(1)",
        "factorial(3)",
    ]
    assert parse_calls("\n".join(f"f({i})" for i in range(30)), "f", max_calls=4).calls == [
        "f(0)",
        "f(1)",
        "f(2)",
        "f(3)",
    ]


def run_probe(folder: Path, module: str, target: str, calls: list[str]) -> list[Observation]:
    (folder / "probe.py").write_text(probe_script(module, target, calls, per_call_s=2), encoding="utf-8")
    subprocess.run(
        [sys.executable, "probe.py", "out.jsonl"],
        cwd=folder,
        check=True,
        timeout=60,
        env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"},
    )
    return read_observations(calls, (folder / "out.jsonl").read_text(encoding="utf-8"))


def test_the_probe_records_values_that_read_back_exceptions_and_unusable_results(tmp_path: Path) -> None:
    (tmp_path / "target.py").write_text(
        "import time\n\n\ndef f(x):\n    if x == 0:\n        raise ValueError('zero')\n"
        "    if x == 1:\n        return object()\n    if x == 2:\n        time.sleep(30)\n"
        "    if x == 3:\n        print('noise')\n        return {'a': (1, 2.5), 'b': {1}}\n"
        "    if x == 4:\n        return True\n    return None\n",
        encoding="utf-8",
    )
    calls = ["f(0)", "f(1)", "f(2)", "f(3)", "f(4)", "f(5)"]
    observed = {o.call: o for o in run_probe(tmp_path, "target", "f", calls)}
    assert observed["f(0)"].status == "raised" and observed["f(0)"].exception == "ValueError"
    assert observed["f(0)"].builtin_exception
    assert observed["f(1)"].status == "unusable" and "read back" in observed["f(1)"].detail
    assert observed["f(2)"].status == "unusable" and observed["f(2)"].detail == "call timed out"
    assert observed["f(3)"].value_repr == "{'a': (1, 2.5), 'b': {1}}"
    test = oracle_test_file("target", "f", list(observed.values()))
    assert "import pytest" in test and "    with pytest.raises(ValueError):\n        f(0)" in test
    assert "assert f(3) == {'a': (1, 2.5), 'b': {1}}" in test
    assert "assert f(4) is True" in test and "assert f(5) is None" in test
    assert "f(1)" not in test and "f(2)" not in test
    assert read_observations(["f(9)"], "")[0].detail == "no result (probe stopped)"
    with pytest.raises(ValueError, match="no usable observation"):
        oracle_test_file("target", "f", [observed["f(1)"]])


def pytest_exit(folder: Path) -> int:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        cwd=folder,
        capture_output=True,
        timeout=60,
    ).returncode


def test_observed_values_make_a_test_that_passes_on_the_commit_and_kills_both_mutants(tmp_path: Path) -> None:
    calls = parse_calls(ANSWER, "slugify").calls
    (tmp_path / "slug.py").write_text(SLUG, encoding="utf-8")
    observed = run_probe(tmp_path, "slug", "slugify", calls)
    assert [o.value_repr for o in observed] == ["'hello-worl'", "'a-b'", "'x_y'", "'eclair'"]
    (tmp_path / "probe.py").unlink()
    (tmp_path / "test_slug_oracle.py").write_text(oracle_test_file("slug", "slugify", observed), "utf-8")
    assert pytest_exit(tmp_path) == 0
    for mutant in mutants(SLUG, "slugify"):
        (tmp_path / "slug.py").write_text(mutant.source, encoding="utf-8")
        assert pytest_exit(tmp_path) == 1, mutant.kind


def test_observe_calls_runs_the_probe_inside_the_sandbox_at_the_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    day = CommitSpec(
        when=datetime(2026, 11, 1, tzinfo=UTC),
        message="day 3",
        files={"slug.py": SLUG, "textstats.py": TEXTSTATS},
    )
    commit = build_history(repo, [day])
    (repo / "slug.py").write_text("def slugify(*a, **k):\n    return 'uncommitted'\n", encoding="utf-8")
    limits = SandboxLimits(timeout_s=20, memory_mb=768)
    run = observe_calls(
        repo,
        commit,
        "textstats",
        "top_words",
        ["top_words('b a b', n=1)", "top_words(1)"],
        limits,
        detect_isolation(),
    )
    assert run.outcome == "ok", run.detail
    assert [o.value_repr for o in run.observations] == ["[('b', 2)]", ""]
    assert run.observations[1].exception == "TypeError" and len(run.usable) == 2
    escape = observe_calls(repo, commit, "slug", "slugify", ["slugify('Hello')"], limits, detect_isolation())
    assert escape.observations[0].value_repr == "'hello'"  # the commit, never the working tree


# Calls the target without checking what came back: the raising mutant kills it, `return None` does not.
WEAK_TEST = "from slug import slugify\n\n\ndef test_slugify_runs():\n    slugify('Hello')\n"


def test_kills_mutants_in_the_sandbox_keeps_a_test_with_teeth_and_restores_the_source(tmp_path: Path) -> None:
    day = CommitSpec(when=datetime(2026, 11, 1, tzinfo=UTC), message="day 3", files={"slug.py": SLUG})
    commit = build_history(tmp_path / "repo", [day])
    limits = SandboxLimits(timeout_s=20, memory_mb=768, runs=1)
    good = oracle_test_file(
        "slug", "slugify", [Observation(call="slugify('A b')", status="value", value_repr="'a-b'")]
    )
    with open_sandbox(tmp_path / "repo", commit, limits, detect_isolation()) as sandbox:
        sandbox.write("test_oracle.py", good)
        sandbox.write("test_weak.py", WEAK_TEST)
        assert judge_test_file(sandbox, "test_oracle.py").accepted
        verdict = kills_mutants(sandbox, "slug.py", "slugify", "test_oracle.py")
        assert verdict.killed_all, verdict.reason
        assert [(r.kind, r.outcome) for r in verdict.runs] == [
            ("raise_not_implemented", "failure"),
            ("return_none", "failure"),
        ]
        weak = kills_mutants(sandbox, "slug.py", "slugify", "test_weak.py")
        assert not weak.killed_all and weak.reason.startswith("survives the return_none mutant")
        assert [r.killed for r in weak.runs] == [True, False]
        assert (sandbox.worktree / "slug.py").read_text(encoding="utf-8") == SLUG
        # A target no mutant can be made of is a rejection with its reason, never an error of the day.
        sandbox.write("plain.py", "class Plain:\n    name = 'plain'\n")
        none = kills_mutants(sandbox, "plain.py", "Plain", "test_oracle.py")
        assert not none.killed_all and none.runs == []
        assert none.reason == "no mutant can be made: class 'Plain' has no method to mutate"

"""The shipped sample repository: its days' own tests pass, every function has a repository test that
calls it by name (what a held-out "write the body" task is judged by), a stale build is rebuilt (git only)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.dataset.holdout_rules import held_out_symbols
from lanes_pipeline.git import git
from lanes_pipeline.repos.symbols import all_symbols, scan_repo
from lanes_pipeline.settings import Settings

DAYS = [folder for _, _, folder in sample_repo.HISTORY]


def functions_and_tests(tree: dict[str, str]) -> tuple[list[str], dict[str, set[str]]]:
    """Top-level function names of the modules, and for each test function the names it calls."""
    functions, calls = [], {}
    for path, text in tree.items():
        if not path.endswith(".py"):
            continue
        for node in ast.parse(text).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            if path.startswith("tests/"):
                called = {
                    n.func.id
                    for n in ast.walk(node)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                }
                calls[node.name] = called
            else:
                functions.append(node.name)
    return functions, calls


@pytest.mark.parametrize("day", DAYS)
def test_each_function_has_a_repository_test_named_for_it_that_calls_it(day: str) -> None:
    functions, calls = functions_and_tests(sample_repo.tree_of(sample_repo.HERE / day))
    assert len(functions) == len(set(functions)), "a name defined twice is ambiguous for a task"
    for name in functions:
        named = [test for test in calls if test.startswith(f"test_{name}")]
        assert any(name in calls[test] for test in named), f"{day}: no test_{name}* calls {name}"


def test_the_sample_grows_to_forty_functions_over_its_days() -> None:
    counts = [len(functions_and_tests(sample_repo.tree_of(sample_repo.HERE / day))[0]) for day in DAYS]
    assert counts == [15, 29, 40]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("day", DAYS)
def test_the_days_own_tests_pass(day: str, tmp_path: Path) -> None:
    shutil.copytree(sample_repo.HERE / day, tmp_path / day)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path / day,
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout


def test_a_build_with_the_right_messages_but_other_content_is_rebuilt(tmp_path: Path) -> None:
    repo = sample_repo.ensure_sample_repo(tmp_path / "sample")
    head = git(repo, "rev-parse", "HEAD").decode().strip()
    assert sample_repo.is_current(repo)
    assert sample_repo.ensure_sample_repo(repo) == repo
    assert git(repo, "rev-parse", "HEAD").decode().strip() == head  # reused, the same hashes
    # An older sample: the same commits and messages, one file's content different on the last day.
    git(repo, "reset", "-q", "--soft", "HEAD~1")
    (repo / "slug.py").write_text("def slugify(title):\n    return title\n", encoding="utf-8")
    git(repo, "add", "slug.py")
    when = sample_repo.HISTORY[-1][0].isoformat()
    env = {
        "GIT_AUTHOR_NAME": "x",
        "GIT_AUTHOR_EMAIL": "x@example.invalid",
        "GIT_COMMITTER_NAME": "x",
        "GIT_COMMITTER_EMAIL": "x@example.invalid",
        "GIT_AUTHOR_DATE": when,
    }
    git(repo, "-c", "commit.gpgsign=false", "commit", "-q", "-m", sample_repo.HISTORY[-1][1], env=env)
    assert git(repo, "log", "--format=%s").decode().splitlines() == [
        m for _, m, _ in reversed(sample_repo.HISTORY)
    ]
    assert not sample_repo.is_current(repo)
    sample_repo.ensure_sample_repo(repo)
    assert git(repo, "rev-parse", "HEAD").decode().strip() == head and sample_repo.is_current(repo)


def test_a_broken_build_is_rebuilt(tmp_path: Path) -> None:
    (tmp_path / "sample" / ".git").mkdir(parents=True)  # a build stopped half-way
    assert not sample_repo.is_current(tmp_path / "sample")
    repo = sample_repo.ensure_sample_repo(tmp_path / "sample")
    assert sample_repo.is_current(repo) and len(git(repo, "log", "--format=%H").split()) == len(DAYS)


def test_the_shipped_hold_out_leaves_at_least_twenty_functions_of_the_last_day_with_repository_tests(
    settings: Settings,
) -> None:
    """Issue 12: held-out functions become "write the body" tasks judged by the repository's own tests."""
    [repo] = [r.name for r in settings.repos.repos if r.path == "embedded"]
    percent = settings.pipeline.dataset.held_out_percent
    tree = sample_repo.tree_of(sample_repo.HERE / DAYS[-1])
    sources = {path: text for path, text in tree.items() if path.endswith(".py")}
    code = [s for s in all_symbols(scan_repo(sources)) if not s.path.startswith("tests/")]
    held = held_out_symbols(repo, code, percent)
    _, calls = functions_and_tests(tree)
    assert len(held) >= 20, [s.name for s in held]
    assert all(any(s.name in called for called in calls.values()) for s in held)

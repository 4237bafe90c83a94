"""The review branch in real git repositories built here (jobs/review_branch.py): one commit per accepted
item with its evidence, the same commits on a re-run, the user's working tree, index, HEAD and stash left
byte for byte, a branch holding someone else's commits refused, bare repositories, detached HEADs and
shallow clones, items that no longer apply skipped with their reason, and the series `lanes export`
writes taken by `git am`. The last tests run the tip's tests in the sandbox."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lanes_pipeline.cpu_lane.jobs.review import review_items
from lanes_pipeline.cpu_lane.jobs.review_branch import (
    ReviewBranchError,
    identity,
    review_command,
    run_tests_at_tip,
    write_branch,
)
from lanes_pipeline.git import CommitSpec, build_history, format_patch, is_bare, is_shallow
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline_tests.cpu_lane.review_fixtures import (
    DAY,
    DOCSTRING,
    accepted_doc,
    accepted_refactor,
    accepted_test,
    calc_repo,
    git_out,
    state_of,
)

BRANCH = f"lanes/{DAY}"
AUTHOR = identity(DAY, "UTC")


def _items(refactor: str | None = None):  # type: ignore[no-untyped-def]
    refactors = [accepted_refactor(new_line=refactor) if refactor else accepted_refactor()]
    return review_items("calc", [accepted_test()], [accepted_doc()], refactors)[0]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _user_commit(repo: Path, message: str = "mine") -> None:
    env = ["-c", "user.name=User", "-c", "user.email=user@example.com", "-c", "commit.gpgsign=false"]
    _git(repo, *env, "commit", "-q", "--allow-empty", "-m", message)


def test_one_commit_per_item_with_the_symbol_and_its_evidence(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    written = write_branch(repo, "calc", base, DAY, _items(), AUTHOR)
    assert written.branch == BRANCH and written.commits == 3
    assert [r.status for r in written.rows] == ["committed"] * 3
    assert git_out(repo, "rev-parse", BRANCH).strip() == written.tip
    log = git_out(repo, "log", "--format=%s%n%b%n--", f"{base}..{BRANCH}")
    assert "Add regression tests of add (calc.py)" in log
    assert "Evidence: passed 3 of 3 runs; fails on all 2 mutants of add (2 of 3 sampled answers" in log
    assert "Document clamp (calc.py)" in log and "Evidence: doctest: 1 examples passed in 3 of 3 runs" in log
    assert "Refactor clamp (calc.py)" in log
    assert "Evidence: the repository's suite: 2 tests passed with the diff applied" in log
    assert log.count(f"Lanes-Review: {DAY}") == 3
    authors = git_out(repo, "log", "--format=%an <%ae> %cn %cI", f"{base}..{BRANCH}").splitlines()
    assert set(authors) == {
        "lanes_pipeline <lanes-pipeline@localhost.invalid> lanes_pipeline 2026-11-01T23:59:59+00:00"
    }
    # The tip holds all three: the test file, the docstring, and the refactor below it.
    calc = git_out(repo, "show", f"{BRANCH}:calc.py")
    assert DOCSTRING.splitlines()[0] in calc and "return min(max(low, value), high)" in calc
    assert "def test_add_1():" in git_out(repo, "show", f"{BRANCH}:test_lanes_symbol_calc_add.py")
    assert review_command(repo, base, DAY) == f"git -C {repo} log -p {base[:12]}..{BRANCH}"


def test_a_rerun_and_another_clone_make_the_same_commits(tmp_path: Path) -> None:
    repo, other = tmp_path / "repo", tmp_path / "other"
    base = calc_repo(repo)
    assert calc_repo(other) == base
    first = write_branch(repo, "calc", base, DAY, _items(), AUTHOR)
    again = write_branch(repo, "calc", base, DAY, _items(), AUTHOR)
    elsewhere = write_branch(other, "calc", base, DAY, _items(), AUTHOR)
    assert first.tip == again.tip == elsewhere.tip
    assert [r.commit for r in first.rows] == [r.commit for r in elsewhere.rows]
    _git(repo, "branch", "-D", BRANCH)
    assert write_branch(repo, "calc", base, DAY, _items(), AUTHOR).tip == first.tip


def test_uncommitted_changes_staged_work_untracked_files_and_the_stash_are_left_byte_for_byte(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    (repo / "calc.py").write_text("# a stashed edit\n")
    _git(repo, "-c", "user.name=U", "-c", "user.email=u@x", "stash", "push", "-q", "-m", "kept")
    (repo / "calc.py").write_text("# not committed\n" + (repo / "calc.py").read_text())
    (repo / "tests" / "test_calc.py").write_text("# staged\n")
    _git(repo, "add", "tests/test_calc.py")
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "test_lanes_symbol_calc_add.py").write_text("# the user's own file of that name\n")
    before = state_of(repo)
    assert "kept" in before["<stash>"] and "calc.py" in before["<status>"]
    written = write_branch(repo, "calc", base, DAY, _items(), AUTHOR)
    assert written.commits == 3
    assert state_of(repo) == before


def _foreign_branch(repo: Path, base: str) -> None:
    _git(repo, "switch", "-q", "-c", BRANCH, base)
    _user_commit(repo, "my own work")
    _git(repo, "switch", "-q", "main")


def test_a_branch_holding_a_commit_the_project_did_not_write_is_refused_and_left_as_it_is(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    _foreign_branch(repo, base)
    tip = git_out(repo, "rev-parse", BRANCH)
    with pytest.raises(ReviewBranchError, match=rf"calc: the branch {BRANCH} in .* my own work\)"):
        write_branch(repo, "calc", base, DAY, _items(), AUTHOR)
    assert git_out(repo, "rev-parse", BRANCH) == tip
    # The project's own branch with the user's commit on top is someone else's too.
    other = tmp_path / "other"
    calc_repo(other)
    write_branch(other, "calc", base, DAY, _items(), AUTHOR)
    _git(other, "switch", "-q", BRANCH)
    _user_commit(other, "a fix on top")
    _git(other, "switch", "-q", "main")
    with pytest.raises(ReviewBranchError, match="a fix on top"):
        write_branch(other, "calc", base, DAY, _items(), AUTHOR)
    # A branch of that name pointing into the repository's own history is the user's.
    third = tmp_path / "third"
    calc_repo(third)
    _git(third, "branch", BRANCH, base)
    with pytest.raises(ReviewBranchError, match="a commit of the repository's own history"):
        write_branch(third, "calc", base, DAY, _items(), AUTHOR)


def test_the_projects_own_branch_follows_the_days_work_and_goes_when_nothing_is_left(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    write_branch(repo, "calc", base, DAY, _items(), AUTHOR)
    fewer = write_branch(repo, "calc", base, DAY, _items()[:2], AUTHOR)
    assert fewer.commits == 2 and git_out(repo, "rev-parse", BRANCH).strip() == fewer.tip
    none = write_branch(repo, "calc", base, DAY, [], AUTHOR)
    assert none.branch is None and none.tip is None
    assert subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "-q", BRANCH]).returncode != 0


def test_a_checked_out_review_branch_is_not_moved(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    written = write_branch(repo, "calc", base, DAY, _items(), AUTHOR)
    _git(repo, "switch", "-q", BRANCH)
    assert write_branch(repo, "calc", base, DAY, _items(), AUTHOR).tip == written.tip  # nothing to move
    with pytest.raises(ReviewBranchError, match="is checked out in a worktree"):
        write_branch(repo, "calc", base, DAY, _items()[:1], AUTHOR)
    assert git_out(repo, "rev-parse", "HEAD").strip() == written.tip


def test_bare_repositories_detached_heads_and_shallow_clones_get_the_same_branch(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    start = datetime(2026, 10, 31, 12, 0, tzinfo=UTC)
    build_history(repo, [CommitSpec(when=start, message="start", files={"README.md": "calc\n"})])
    base = calc_repo(repo)
    _user_commit(repo, "later work")  # the day's snapshot is not the tip of the history
    expected = write_branch(repo, "calc", base, DAY, _items(), AUTHOR).tip
    _git(repo, "branch", "-D", BRANCH)

    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True)
    assert is_bare(bare)
    assert write_branch(bare, "calc", base, DAY, _items(), AUTHOR).tip == expected

    _git(repo, "switch", "-q", "--detach", base)
    before = state_of(repo)
    assert write_branch(repo, "calc", base, DAY, _items(), AUTHOR).tip == expected
    assert state_of(repo) == before and git_out(repo, "rev-parse", "HEAD").strip() == base

    shallow = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "2", "--no-local", f"file://{repo}", str(shallow)], check=True
    )
    assert is_shallow(shallow)
    assert write_branch(shallow, "calc", base, DAY, _items(), AUTHOR).tip == expected


def test_an_item_that_no_longer_applies_or_names_another_file_is_skipped_with_its_reason(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    stale = accepted_refactor().model_copy(
        update={"diff": accepted_refactor().diff.replace("    if low > high:", "    if high < low:")}  # type: ignore[union-attr]
    )
    elsewhere = accepted_refactor().model_copy(
        update={"diff": accepted_refactor().diff.replace("calc.py", "other.py")}  # type: ignore[union-attr]
    )
    outside = accepted_test().model_copy(update={"test_file": "../test_outside.py"})
    items, _ = review_items("calc", [accepted_test(), outside], [accepted_doc()], [stale, elsewhere])
    written = write_branch(repo, "calc", base, DAY, items, AUTHOR)
    skipped = [r.reason for r in written.rows if r.status == "skipped"]
    assert written.commits == 2 and len(skipped) == 3
    assert "'../test_outside.py' is not a path inside the repository" in skipped
    stale_reason = "the patch no longer applies to the day's commit: error: patch failed: calc.py"
    assert skipped[1].startswith(stale_reason), skipped
    assert skipped[2] == "changes b/other.py, not only calc.py"
    assert "other.py" not in git_out(repo, "log", "-p", f"{base}..{BRANCH}")


def test_a_docstring_and_a_refactor_of_one_symbol_both_land_and_a_clash_is_skipped(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    second = accepted_refactor(new_line="    return sorted([low, value, high])[1]")
    items, _ = review_items("calc", [], [accepted_doc()], [accepted_refactor(), second])
    written = write_branch(repo, "calc", base, DAY, items, AUTHOR)
    assert [r.status for r in written.rows] == ["committed", "committed", "skipped"]
    assert written.rows[2].reason == "clashes with an earlier commit of the day in calc.py (1 conflict(s))"
    calc = git_out(repo, "show", f"{BRANCH}:calc.py")
    assert DOCSTRING.splitlines()[0] in calc and "return min(max(low, value), high)" in calc


def test_an_item_the_allowlist_refuses_never_reaches_the_branch(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    hostile = "    import os; getattr(os, 'sys'+'tem')('id')\n    return max(low, min(value, high))"
    written = write_branch(repo, "calc", base, DAY, _items(refactor=hostile), AUTHOR)
    [row] = [r for r in written.rows if r.kind == "refactor"]
    assert row.status == "skipped" and "adds an import: import os" in row.reason
    assert "sys'+'tem" not in git_out(repo, "log", "-p", f"{base}..{BRANCH}")


def test_the_exported_series_is_taken_by_git_am_and_git_apply(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    written = write_branch(repo, "calc", base, DAY, _items(), AUTHOR)
    patches = format_patch(repo, base, BRANCH, tmp_path / "patches")
    assert [p.name[:5] for p in patches] == ["0001-", "0002-", "0003-"]
    assert "Evidence: passed 3 of 3 runs" in patches[0].read_text()
    checked = tmp_path / "checked"
    subprocess.run(["git", "clone", "-q", str(repo), str(checked)], check=True)
    _git(checked, "switch", "-q", "--detach", base)
    for patch in patches:
        _git(checked, "apply", "--check", str(patch))
        _git(checked, "apply", "--index", str(patch))
    applied = tmp_path / "applied"
    subprocess.run(["git", "clone", "-q", str(repo), str(applied)], check=True)
    _git(applied, "switch", "-q", "--detach", base)
    env = ["-c", "user.name=Reviewer", "-c", "user.email=r@example.com", "-c", "commit.gpgsign=false"]
    _git(applied, *env, "am", "-q", *map(str, patches))
    tree = git_out(applied, "rev-parse", "HEAD^{tree}")
    assert tree == git_out(repo, "rev-parse", f"{written.tip}^{{tree}}")
    assert git_out(checked, "write-tree") == tree


LIMITS = SandboxLimits(timeout_s=60, memory_mb=1024, runs=1)


def test_the_tips_tests_run_in_the_sandbox(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    base = calc_repo(repo)
    written = write_branch(repo, "calc", base, DAY, _items(), AUTHOR)
    assert written.tip is not None
    passing = run_tests_at_tip(repo, written.tip, LIMITS, tmp_path / "data")
    assert passing.passed and passing.outcome == "passed (3 tests)", passing
    broken = "    return max(low, min(value, high)) + 1"
    _git(repo, "branch", "-D", BRANCH)
    failing = write_branch(repo, "calc", base, DAY, _items(refactor=broken), AUTHOR)
    assert failing.tip is not None
    result = run_tests_at_tip(repo, failing.tip, LIMITS, tmp_path / "data")
    assert not result.passed and result.outcome.startswith("failure"), result

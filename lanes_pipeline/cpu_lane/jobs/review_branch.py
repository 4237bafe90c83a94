"""Writing the day's review branch `lanes/<day>` into a repository (git plumbing, git.py), and checking its
tests at the tip (the sandbox, in the repository's environment).

Each item is staged in a scratch index holding the previous commit's tree (a test file added; a diff
applied with `git apply --cached` to the day's commit, where it was judged, and merged into the branch's
version of its file), filtered (review.item_problem), and committed with `commit-tree` on top of the one
before, starting at the day's snapshot commit; the branch moves last, with `update-ref` checking the
value it replaces. The user's working tree, index, HEAD and stash are never read or written, so a
repository with uncommitted changes, a bare one, a detached HEAD or a shallow clone are all the same here.
The author, committer and dates are fixed (the end of the day), so a re-run writes the same commits.

A `lanes/<day>` branch that holds a commit the project did not write is refused (ReviewBranchError names
it) and left as it is; one checked out in some worktree is refused too, since moving it would change
that worktree's files under the user.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, timedelta
from pathlib import Path

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.jobs.docstring_day import repo_python
from lanes_pipeline.cpu_lane.jobs.review import (
    AUTHOR_EMAIL,
    AUTHOR_NAME,
    ReviewItem,
    commit_message,
    item_problem,
    normalized_patch,
    written_by_us,
)
from lanes_pipeline.cpu_lane.jobs.rows import ReviewItemRow
from lanes_pipeline.git import (
    Identity,
    ScratchIndex,
    blob_at,
    checked_out_branches,
    commit_tree,
    commits_not_in,
    delete_ref,
    merge_texts,
    move_ref,
    read_text,
    resolve,
    scratch_index,
    tree_id,
)
from lanes_pipeline.repos.snapshot import end_of_day
from lanes_pipeline.sandbox.isolation import Isolation, open_sandbox, run_pytest
from lanes_pipeline.sandbox.python_source import python_file_bytes
from lanes_pipeline.sandbox.safety import safe_repo_path
from lanes_pipeline.settings import SandboxLimits

ItemCheck = Callable[[ReviewItem, str | None, str], str | None]


class ReviewBranchError(RuntimeError):
    """A review branch that may not be written: the message names the repository, the branch and why."""


class BranchWrite(Frozen):
    """What writing a repository's review branch did: the branch (None: no item became a commit, and
    no branch of the day is left), its base and tip, and a row per item."""

    branch: str | None
    base: str
    tip: str | None
    rows: list[ReviewItemRow]

    @property
    def commits(self) -> int:
        return sum(r.status == "committed" for r in self.rows)


def branch_name(day: str) -> str:
    return f"lanes/{day}"


def identity(day: str, timezone: str) -> Identity:
    """The project's author and committer, dated the last second of the day in the pipeline's zone."""
    when = end_of_day(date.fromisoformat(day), timezone) - timedelta(seconds=1)
    return Identity(name=AUTHOR_NAME, email=AUTHOR_EMAIL, when=when.isoformat())


def review_command(location: Path, base: str, day: str) -> str:
    """The command that shows the day's work, commit by commit."""
    return f"git -C {location} log -p {base[:12]}..{branch_name(day)}"


def foreign_commits(repo: Path, tip: str, base: str) -> list[str]:
    """The commits of the branch at `tip` (those not in `base`) the project did not write, as `sha subject`;
    a tip inside `base`'s history is the user's own commit."""
    commits = commits_not_in(repo, tip, base)
    if not commits:
        return [f"{tip[:12]} (a commit of the repository's own history)"]
    return [
        f"{c.sha[:12]} {c.message.splitlines()[0] if c.message else ''}".strip()
        for c in commits
        if not written_by_us(c.author_email, c.committer_email, c.message)
    ]


def existing_tip(repo: Path, name: str, day: str, base: str) -> str | None:
    """The branch's tip when it exists and holds only the project's commits; refused otherwise."""
    tip = resolve(repo, f"refs/heads/{branch_name(day)}")
    if tip is None:
        return None
    foreign = foreign_commits(repo, tip, base)
    if foreign:
        raise ReviewBranchError(
            f"{name}: the branch {branch_name(day)} in {repo} holds commits lanes_pipeline did not write "
            f"({'; '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}); it is left as it is. Rename "
            f"or delete it (git -C {repo} branch -m {branch_name(day)} <other name>) to get the day's "
            "review branch"
        )
    return tip


class _Stager:
    """Stages items one by one on top of the branch so far. Every patch was judged against the day's
    commit, so it is applied there (a scratch index of its own), and the file it makes is merged into the
    branch's version of that file (`git merge-file`): a docstring and a refactor of the same symbol both
    land, and a patch that no longer applies to the commit, or clashes with an earlier one, is skipped."""

    def __init__(self, repo: Path, base: str, index: ScratchIndex, pristine: ScratchIndex) -> None:
        self.repo, self.base, self.index, self.pristine = repo, base, index, pristine
        self.base_tree = tree_id(repo, base)

    def text_at(self, commit: str, path: str) -> str | None:
        blob = blob_at(self.repo, commit, path)
        return None if blob is None else read_text(self.repo, blob)

    def stage(self, parent: str, item: ReviewItem, check: ItemCheck) -> str:
        """Stage `item` on `parent`'s tree; '' when it is staged, else why it is skipped."""
        if not safe_repo_path(item.path):
            return f"{item.path!r} is not a path inside the repository"
        before = self.text_at(parent, item.path)
        if item.content is not None:
            after = item.content
        else:
            merged = self._merged(parent, item, before)
            if isinstance(merged, tuple):
                return merged[0]
            after = merged
        if before == after:
            return "already in the repository"
        problem = check(item, before, after)
        if problem:
            return problem
        data, encoding = python_file_bytes(after)
        if encoding:  # the check read the file as Python will; a check that did not is refused here
            return f"{item.path}: {encoding}"
        self.index.put(item.path, data)
        return ""

    def _merged(self, parent: str, item: ReviewItem, before: str | None) -> str | tuple[str]:
        normalized = normalized_patch(item.patch or "", item.path)
        if isinstance(normalized, tuple):
            return (normalized[0],)
        original = self.text_at(self.base, item.path)
        if original is None or before is None:
            return (f"{item.path} is not in the repository at the day's commit",)
        self.pristine.reset(self.base_tree)
        why = self.pristine.apply(normalized)
        if why:
            return (f"the patch no longer applies to the day's commit: {why}"[:600],)
        theirs = self.pristine.read(item.path)
        if theirs is None:
            return (f"the patch removes {item.path}",)
        merged, conflicts = merge_texts(before, original, theirs.decode("utf-8", "replace"))
        if conflicts:
            return (f"clashes with an earlier commit of the day in {item.path} ({conflicts} conflict(s))",)
        return merged


def write_branch(
    repo: Path,
    name: str,
    base: str,
    day: str,
    items: Sequence[ReviewItem],
    author: Identity,
    check: ItemCheck = item_problem,
) -> BranchWrite:
    """Commit `items` in order on top of `base` and point `lanes/<day>` at the last one (see the module's
    notes); an item that cannot be staged or fails `check` is skipped with its reason."""
    ref = f"refs/heads/{branch_name(day)}"
    current = existing_tip(repo, name, day, base)
    rows: list[ReviewItemRow] = []
    parent = base
    with scratch_index(repo, base) as index, scratch_index(repo, base) as pristine:
        stager = _Stager(repo, base, index, pristine)
        for item in items:
            tree = tree_id(repo, parent)
            index.reset(tree)
            why = stager.stage(parent, item, check)
            if not why and index.write_tree() == tree:
                why = "changes nothing at the commit"
            if why:
                rows.append(item.row("skipped", why))
                continue
            parent = commit_tree(repo, index.write_tree(), parent, commit_message(item, day), author)
            rows.append(item.row("committed", "", parent))
    tip = None if parent == base else parent
    if tip != current:
        if ref in checked_out_branches(repo):
            raise ReviewBranchError(
                f"{name}: the branch {branch_name(day)} is checked out in a worktree of {repo}; switch to "
                "another branch there to let the day's review branch be written"
            )
        reason = f"lanes_pipeline: review branch of {day}"
        if tip is None:
            assert current is not None
            delete_ref(repo, ref, current, reason)
        else:
            move_ref(repo, ref, tip, current, reason)
    return BranchWrite(branch=branch_name(day) if tip else None, base=base, tip=tip, rows=rows)


class TipTests(Frozen):
    passed: bool
    outcome: str


def run_tests_at_tip(
    repo: Path, tip: str, limits: SandboxLimits, data_dir: Path, isolation: Isolation | None = None
) -> TipTests:
    """The repository's tests at the branch's tip, once, in the sandbox with its own environment."""
    python, why = repo_python(repo, tip, data_dir)
    if why:
        return TipTests(passed=False, outcome=why)
    with open_sandbox(repo, tip, limits, isolation) as sandbox:
        run = run_pytest(sandbox, ["."], python=python)
    if run.outcome == "passed":
        return TipTests(passed=True, outcome=f"passed ({run.passed} tests)")
    return TipTests(passed=False, outcome=f"{run.outcome}: {run.detail}"[:600])

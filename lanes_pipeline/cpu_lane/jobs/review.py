"""The day's accepted work as review items, pure: what each commit of the review branch changes, its
message with the evidence, and the filter every item passes before it is committed (allowlist.py).

One item per accepted result: a generated test (a new file, where the gate ran it), a docstring (the diff
of its file the gate checked) or a refactor diff (confined to its symbol, the suite passed with it). Items go
in a fixed order (tests, then docstrings, then refactors, each by file and symbol), so a re-run makes the
same commits. review_branch.py writes them into the repository.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import PurePosixPath

from pydantic import Field
from unidiff import PatchSet, UnidiffParseError

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.jobs.allowlist import (
    carried_problem,
    docstring_change_problem,
    example_problems,
    oracle_test_problem,
)
from lanes_pipeline.cpu_lane.jobs.exception_tests import checks_of_test
from lanes_pipeline.cpu_lane.jobs.rows import (
    GeneratedDocRow,
    GeneratedTestRow,
    RefactorRow,
    ReviewItemRow,
    ReviewKind,
)
from lanes_pipeline.cpu_lane.jobs.value_allowlist import refactor_problems
from lanes_pipeline.sandbox.python_source import python_file_bytes
from lanes_pipeline.sandbox.safety import safe_repo_path, secret_findings

KIND_ORDER: dict[ReviewKind, int] = {"test": 0, "docstring": 1, "refactor": 2}
TRAILER = "Lanes-Review"  # the trailer that marks a commit of the project's review branch, with the day
AUTHOR_NAME = "lanes_pipeline"
AUTHOR_EMAIL = "lanes-pipeline@localhost.invalid"


class ReviewItem(Frozen):
    """One accepted result as a change of the repository."""

    kind: ReviewKind
    repo: str
    path: str  # the file it changes: a test's own file, or the symbol's file
    source_path: str  # the symbol's file
    module: str
    symbol: str
    content: str | None = None  # a test module, added whole
    patch: str | None = None  # a docstring's or refactor's unified diff of `path`
    docstring: str | None = None  # the docstring the gate accepted
    evidence: str
    checks: list[str] = Field([], description="what the gate checked it for, in order (docs/review.md)")

    @property
    def label(self) -> str:
        return f"{self.kind} {self.source_path}::{self.symbol}"

    def row(self, status: str, reason: str, commit: str | None = None) -> ReviewItemRow:
        return ReviewItemRow(
            repo=self.repo,
            kind=self.kind,
            path=self.path,
            symbol=f"{self.source_path}::{self.symbol}",
            status=status,  # type: ignore[arg-type]
            reason=reason,
            commit=commit,
            checks=self.checks,
        )


# What an accepted refactor passed (diff_judge): confined to its symbol, applied at the commit, and the
# repository's suite and the day's accepted tests still passing with it.
REFACTOR_CHECKS = ("confined to the symbol", "applies at the commit", "the suite passes")


def review_items(
    repo: str,
    tests: Sequence[GeneratedTestRow],
    docs: Sequence[GeneratedDocRow],
    refactors: Sequence[RefactorRow],
) -> tuple[list[ReviewItem], list[ReviewItemRow]]:
    """The repository's accepted results of the day as items in commit order, and a skip row for each
    accepted result that cannot be one (a row of a whole file, written before the jobs went by symbol)."""
    items: list[ReviewItem] = []
    skipped: list[ReviewItemRow] = []

    def skip(kind: ReviewKind, path: str, symbol: str | None, why: str) -> None:
        skipped.append(
            ReviewItemRow(
                repo=repo,
                kind=kind,
                path=path,
                symbol=f"{path}::{symbol or ''}",
                status="skipped",
                reason=why,
            )
        )

    for test in tests:
        if test.repo != repo or not test.accepted:
            continue
        if test.code is None or test.symbol is None:
            skip("test", test.path, test.symbol, "a test of a whole file: only a symbol's test is committed")
            continue
        evidence = test.reason
        if test.sampled is not None and test.accepted_answers is not None:
            evidence += f" ({test.accepted_answers} of {test.sampled} sampled answers accepted)"
        items.append(
            ReviewItem(
                kind="test",
                repo=repo,
                path=test.test_file,
                source_path=test.path,
                module=test.module,
                symbol=test.symbol,
                content=test.code,
                evidence=evidence,
                checks=checks_of_test(test.code),
            )
        )
    for doc in docs:
        if doc.repo != repo or not doc.accepted:
            continue
        if doc.diff is None or doc.docstring is None:
            skip("docstring", doc.path, doc.symbol, "the row holds no diff of the file")
            continue
        items.append(
            ReviewItem(
                kind="docstring",
                repo=repo,
                path=doc.path,
                source_path=doc.path,
                module=doc.module,
                symbol=doc.symbol,
                patch=doc.diff,
                docstring=doc.docstring,
                evidence=f"doctest: {doc.reason}",
                checks=doc.checks,
            )
        )
    for diff in refactors:
        if diff.repo != repo or not diff.accepted:
            continue
        if diff.diff is None or diff.symbol is None:
            skip(
                "refactor",
                diff.path,
                diff.symbol,
                "a diff of a whole file: only a symbol's diff is committed",
            )
            continue
        items.append(
            ReviewItem(
                kind="refactor",
                repo=repo,
                path=diff.path,
                source_path=diff.path,
                module="",
                symbol=diff.symbol,
                patch=diff.diff,
                evidence=f"the repository's suite: {diff.reason}",
                checks=list(REFACTOR_CHECKS),
            )
        )
    items.sort(key=lambda i: (KIND_ORDER[i.kind], i.source_path, i.symbol, i.path))
    return items, skipped


def normalized_patch(patch: str, path: str) -> str | tuple[str, str]:
    """The patch rebuilt from its hunks as a diff of `path` alone (`--- a/path`, `+++ b/path`, hunks), or
    (problem, '') when it is anything else: another file, a rename, a mode change, binary content. Only the
    rebuilt text goes to `git apply`, so nothing outside the hunks can ride along."""
    if not safe_repo_path(path):
        return f"{path!r} is not a path inside the repository", ""
    try:
        parsed = PatchSet(patch)
    except UnidiffParseError as exc:
        return f"not a unified diff: {exc}"[:300], ""
    if len(parsed) != 1:
        return f"changes {len(parsed)} files, not only {path}", ""
    (patched,) = parsed
    if (patched.source_file, patched.target_file) != (f"a/{path}", f"b/{path}") or patched.is_binary_file:
        return f"changes {patched.target_file}, not only {path}", ""
    if not len(patched):
        return "no hunk", ""
    return f"--- a/{path}\n+++ b/{path}\n" + "".join(str(hunk) for hunk in patched)


def added_text(before: str | None, after: str) -> str:
    """The lines `after` has that `before` had not (all of it for a new file)."""
    if before is None:
        return after
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return "\n".join(line[1:] for line in diff if line.startswith("+") and not line.startswith("+++"))


def item_problem(item: ReviewItem, before: str | None, after: str) -> str | None:
    """Why an item may not reach the branch (None: it may), given its file before and after the change:
    the file as Python will read it, the allowlist of its kind, then what no change (nor its commit's
    message) may carry."""
    problems: list[str] = []
    _, encoding = python_file_bytes(after)
    problems += [f"{item.path}: {encoding}"] if encoding else []
    after = after.removeprefix("\ufeff")  # Python reads a UTF-8 file past its byte-order mark
    if item.kind == "test":
        name = PurePosixPath(item.path).name
        ours = before is None or oracle_test_problem(before, item.module, item.symbol) is None
        if not (ours and name.startswith("test_") and name.endswith(".py")):
            return f"{item.path}: a test is a file named test_*.py, new or an earlier test of {item.symbol}"
        problem = oracle_test_problem(after, item.module, item.symbol)
        problems += [f"not a regression oracle: {problem}"] if problem else []
    elif item.kind == "docstring":
        if before is None or item.docstring is None:
            return f"{item.path} is not in the repository"
        problems += [f"doctest {p}" for p in example_problems(item.docstring, item.symbol)]
        problem = docstring_change_problem(before, after, item.symbol, item.docstring)
        problems += [problem] if problem else []
    else:
        if before is None:
            return f"{item.path} is not in the repository"
        problems += refactor_problems(before, after, item.symbol)
    carried = carried_problem(added_text(before, after))
    problems += [carried] if carried else []
    # A key split over lines or built by an expression shows only in the whole file: what it adds.
    hidden = sorted(set(secret_findings(after)) - set(secret_findings(before or "")))
    if hidden and not carried:
        problems.append(f"holds what looks like a secret ({', '.join(hidden)})")
    message = carried_problem(commit_message(item, "0000-00-00"))
    problems += [f"its commit message {message}"] if message else []
    return "; ".join(problems)[:600] if problems else None


SUBJECTS: dict[ReviewKind, str] = {
    "test": "Add regression tests of {symbol} ({path})",
    "docstring": "Document {symbol} ({path})",
    "refactor": "Refactor {symbol} ({path})",
}


def commit_message(item: ReviewItem, day: str) -> str:
    """The commit's message: what it does to which symbol, the evidence the gate gave, and the trailers
    that say the project wrote it (a branch holding any other commit is refused, never overwritten)."""
    subject = SUBJECTS[item.kind].format(symbol=item.symbol, path=item.source_path)
    return (
        f"{subject}\n\n"
        f"Written by lanes_pipeline's CPU lane on {day}; verified in its sandbox at the day's commit.\n"
        f"Evidence: {item.evidence}\n"
        + (f"Checks passed: {', '.join(item.checks)}\n" if item.checks else "")
        + f"\n{TRAILER}: {day}\n"
        f"Lanes-Item: {item.label}\n"
    )


def written_by_us(author_email: str, committer_email: str, message: str) -> bool:
    """Whether a commit is one the project wrote on a review branch."""
    trailer = any(line.startswith(f"{TRAILER}: ") for line in message.splitlines())
    return author_email == committer_email == AUTHOR_EMAIL and trailer


def checks_report(rows: Sequence[ReviewItemRow]) -> str:
    """`lanes report --day D`'s section on the review branch: each item of the day, what became of it and
    the checks it passed (docs/review.md says what each one means)."""
    lines = [f"## The review branch: {len(rows)} item(s)", ""]
    if not rows:
        return "\n".join([*lines, "none"])
    lines += ["| repository | item | status | checks passed |", "|---|---|---|---|"]
    for row in rows:
        where = row.commit[:12] if row.commit else row.reason
        checks = ", ".join(row.checks) or "(not listed)"
        lines.append(f"| {row.repo} | {row.kind} {row.symbol} | {row.status} {where} | {checks} |")
    return "\n".join(lines)

"""The sample repository the embedded default works on (`repos.yaml`: `path: embedded`).

A small but real Python project with tests, committed on three days: the folders `day1/`, `day2/`,
`day3/` beside this file hold the whole tree of each commit. It is built with git under
`<data dir>/sample_repo/` by code (never a nested `.git` in this project), with fixed authors and dates, so
its commit hashes are the same on every machine and `make run` shows real output on a fresh checkout.

Its modules: textstats.py and slug.py (the first six functions, which many tests read as they are),
mathbits.py (day 1), textcase.py (day 2, two functions changed on day 3) and seqtools.py (day 3): about
forty small functions, each with a docstring and the repository's own tests that call it by name, so a
50% hold-out by hash leaves at least twenty "write the body" tasks judged by those tests.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import tempfile
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from lanes_pipeline.git import CommitSpec, GitError, build_history, git

HERE = Path(__file__).resolve().parent
EMBEDDED_REPO = "embedded"
# The sample's first modules: tests written against the six functions it began with replay its history
# restricted to these (`history(FIRST_MODULES)`), so growing the sample does not change what they count.
FIRST_MODULES = frozenset({"textstats", "slug"})
HISTORY = (
    (datetime(2026, 11, 1, 12, 0, tzinfo=UTC), "textstats: words, counts and top words; mathbits", "day1"),
    (datetime(2026, 11, 2, 12, 0, tzinfo=UTC), "average word length; slugify; textcase", "day2"),
    (
        datetime(2026, 11, 3, 12, 0, tzinfo=UTC),
        "slug: separators and unique slugs; seqtools; textcase: acronyms, truncate suffix",
        "day3",
    ),
)


def tree_of(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def of_modules(path: str, modules: Collection[str]) -> bool:
    """Whether `path` is one of `modules` (`slug.py`) or its tests (`tests/test_slug.py`); a file that is
    not Python (README.md) belongs to every selection."""
    file = PurePosixPath(path)
    return file.suffix != ".py" or file.stem.removeprefix("test_") in modules


def history(modules: Collection[str] | None = None) -> list[CommitSpec]:
    """Each day's folder as a whole-tree commit: files missing from a day are deleted that day.

    With `modules`, only those modules, their tests and the non-Python files are in each commit.
    """
    commits, previous = [], {}
    for when, message, folder in HISTORY:
        tree = {p: t for p, t in tree_of(HERE / folder).items() if modules is None or of_modules(p, modules)}
        files: dict[str, str | None] = {**dict.fromkeys(previous), **tree}
        commits.append(CommitSpec(when=when, message=message, files=files))
        previous = tree
    return commits


def blob_hash(text: str) -> str:
    """git's object id of a file with this content (`git hash-object`), computed without git."""
    data = text.encode("utf-8")
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def expected_commits() -> list[tuple[str, str, dict[str, str]]]:
    """(author date, message, path -> blob id) of each commit, oldest first, from the day folders."""
    return [
        (when.isoformat(), message, {path: blob_hash(text) for path, text in tree_of(HERE / folder).items()})
        for when, message, folder in HISTORY
    ]


def built_commits(repo: Path) -> list[tuple[str, str, dict[str, str]]]:
    """The same triple for each commit of a built repository's HEAD, oldest first, read from git objects."""
    commits = []
    log = git(repo, "log", "--reverse", "--format=%H%x1f%aI%x1f%s").decode().splitlines()
    for line in log:
        commit, date, message = line.split("\x1f")
        tree = {}
        for entry in git(repo, "ls-tree", "-r", "-z", commit).decode().split("\0"):
            if entry:
                meta, path = entry.split("\t", 1)
                tree[path] = meta.split()[2]
        commits.append((date, message, tree))
    return commits


def is_current(repo: Path) -> bool:
    """Whether `repo` holds exactly the expected history: every commit's date, message and whole tree.

    Messages alone are not enough: when the day folders change, an old build under the data folder would
    otherwise be reused silently with the old code.
    """
    if not (repo / ".git").exists():
        return False
    try:
        return built_commits(repo) == expected_commits()
    except (GitError, ValueError, IndexError):
        return False  # an unreadable or half-built repository is rebuilt


def ensure_sample_repo(target: Path) -> Path:
    """Build the sample repository at `target` unless it is already there with the expected history.

    Runs that start at once (two runs of a day, a backfill's days on a fresh data folder) check and build
    under one lock file beside it: without it, each built its own and replaced the other's while that run
    was reading it (the fault drills' concurrent runs: `git ls-tree` answered BAD for a blob)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        if is_current(target):
            return target
        staging = Path(tempfile.mkdtemp(prefix=".sample_repo.", dir=target.parent))
        try:
            build_history(staging / "repo", history())
            if target.exists():
                shutil.rmtree(target)
            (staging / "repo").rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target

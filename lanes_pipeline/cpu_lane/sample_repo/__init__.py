"""The sample repository the embedded default works on (`repos.yaml`: `path: embedded`).

A small but real Python project with tests, committed on three days: the folders `day1/`, `day2/`,
`day3/` beside this file hold the whole tree of each commit. It is built with git under
`<data dir>/sample_repo/` by code (never a nested `.git` in this project), with fixed authors and dates, so
its commit hashes are the same on every machine and `make run` shows real output on a fresh checkout.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from lanes_pipeline.cpu_lane.repos import CommitSpec, build_history, git

HERE = Path(__file__).resolve().parent
EMBEDDED_REPO = "embedded"
HISTORY = (
    (datetime(2026, 11, 1, 12, 0, tzinfo=UTC), "textstats: words, counts and top words", "day1"),
    (datetime(2026, 11, 2, 12, 0, tzinfo=UTC), "average word length; slugify", "day2"),
    (datetime(2026, 11, 3, 12, 0, tzinfo=UTC), "slug: separators and unique slugs", "day3"),
)


def tree_of(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def history() -> list[CommitSpec]:
    """Each day's folder as a whole-tree commit: files missing from a day are deleted that day."""
    commits, previous = [], {}
    for when, message, folder in HISTORY:
        tree = tree_of(HERE / folder)
        files: dict[str, str | None] = {**dict.fromkeys(previous), **tree}
        commits.append(CommitSpec(when=when, message=message, files=files))
        previous = tree
    return commits


def ensure_sample_repo(target: Path) -> Path:
    """Build the sample repository at `target` unless it is already there with the expected history."""
    expected = [message for _, message, _ in reversed(HISTORY)]
    if (target / ".git").exists():
        log = git(target, "log", "--format=%s").decode().splitlines()
        if log == expected:
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".sample_repo.", dir=target.parent))
    try:
        build_history(staging / "repo", history())
        if target.exists():
            shutil.rmtree(target)
        (staging / "repo").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target

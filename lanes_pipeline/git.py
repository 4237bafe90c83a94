"""Reading a repository from git objects (`ls-tree`, `cat-file`), never from its working tree, and building
one with a dated history (the sample repository and test fixtures). Git runs without the user's or the
system's config, so hooks, pagers and `safe.directory` rules never change a result."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path

from lanes_pipeline.config.base import Frozen


class TreeEntry(Frozen):
    """One blob of `git ls-tree -r -l`."""

    path: str
    blob: str
    size: int
    mode: str


class GitError(RuntimeError):
    pass


def _git_env() -> dict[str, str]:
    # No user or system config: a user's hooks, pagers, or `safe.directory` rules never change the result.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"})
    return env


def git(repo: Path, *args: str, input: bytes | None = None, env: Mapping[str, str] | None = None) -> bytes:
    command = ["git", "-c", "safe.directory=*", "-C", str(repo), *args]
    result = subprocess.run(
        command, input=input, capture_output=True, env={**_git_env(), **(env or {})}, check=False
    )
    if result.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed in {repo}: {result.stderr.decode(errors='replace')}")
    return result.stdout


def commit_as_of(repo: Path, branch: str, until: datetime) -> str | None:
    """The newest commit on `branch` committed strictly before `until`, or None if there is none."""
    try:
        git(repo, "rev-parse", "--verify", "--quiet", f"{branch}^{{commit}}")
    except GitError:
        return None  # an empty repository: no branch yet
    # --before is inclusive of the second; end_of_day is the next day's first second, so step back one.
    cutoff = int(until.timestamp()) - 1
    out = git(repo, "rev-list", "-1", f"--before={cutoff}", branch).decode().strip()
    return out or None


def commit_time(repo: Path, commit: str) -> str:
    return git(repo, "show", "-s", "--format=%cI", commit).decode().strip()


_LS_TREE = re.compile(r"^(\d{6}) (\w+) ([0-9a-f]+) +(-|\d+)\t(.*)$")


def ls_tree(repo: Path, commit: str) -> list[TreeEntry]:
    out = git(repo, "ls-tree", "-r", "-l", "-z", commit).decode("utf-8", errors="surrogateescape")
    entries = []
    for record in filter(None, out.split("\0")):
        match = _LS_TREE.match(record)
        if match is None:
            raise GitError(f"unexpected ls-tree line {record!r}")
        mode, kind, blob, size, path = match.groups()
        if kind == "blob":
            entries.append(TreeEntry(path=path, blob=blob, size=int(size), mode=mode))
    return entries


def read_blobs(repo: Path, blobs: Iterable[str]) -> dict[str, bytes]:
    """Contents of many blobs with one `git cat-file --batch`."""
    wanted = sorted(set(blobs))
    if not wanted:
        return {}
    out = git(repo, "cat-file", "--batch", input="".join(f"{b}\n" for b in wanted).encode())
    contents: dict[str, bytes] = {}
    position = 0
    for blob in wanted:
        header_end = out.index(b"\n", position)
        name, kind, size = out[position:header_end].decode().split(" ")
        if kind != "blob" or name != blob:
            raise GitError(f"cat-file returned {kind} {name} for {blob}")
        start = header_end + 1
        contents[blob] = out[start : start + int(size)]
        position = start + int(size) + 1
    return contents


def read_text(repo: Path, blob: str) -> str:
    return read_blobs(repo, [blob])[blob].decode("utf-8")


# ---------------------------------------------------------------------------------------------------------
# Building a repository with a dated history (the sample repository and test fixtures)
# ---------------------------------------------------------------------------------------------------------


class CommitSpec(Frozen):
    """One commit: the whole tree (path -> text; None deletes the path) and when it was made."""

    when: datetime
    message: str
    files: dict[str, str | None]


def build_history(repo: Path, commits: Sequence[CommitSpec], author: str = "Sample Author") -> str:
    """Create (or extend) a git repository with these commits at their dates; return the last commit.

    Fixed author, committer and dates make the commit hashes the same on every machine, so a rebuilt
    sample repository gives byte-identical snapshots.
    """
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / ".git").exists():
        git(repo, "init", "-q", "-b", "main")
    for spec in commits:
        for rel, text in spec.files.items():
            target = repo / rel
            if text is None:
                git(repo, "rm", "-q", "--cached", "--ignore-unmatch", rel)
                target.unlink(missing_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            git(repo, "add", "--force", "--", rel)  # the spec is the tree: even ignored paths
        stamp = spec.when.isoformat()
        env = {
            "GIT_AUTHOR_NAME": author,
            "GIT_AUTHOR_EMAIL": "sample@example.invalid",
            "GIT_COMMITTER_NAME": author,
            "GIT_COMMITTER_EMAIL": "sample@example.invalid",
            "GIT_AUTHOR_DATE": stamp,
            "GIT_COMMITTER_DATE": stamp,
        }
        git(repo, "-c", "commit.gpgsign=false", "commit", "-q", "--allow-empty", "-m", spec.message, env=env)
    return git(repo, "rev-parse", "HEAD").decode().strip()

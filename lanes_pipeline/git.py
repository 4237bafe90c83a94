"""Reading a repository from git objects (`ls-tree`, `cat-file`), never from its working tree; building one
with a dated history (the sample repository and test fixtures); and writing commits onto a branch of a
user's repository with plumbing only (a scratch index, `commit-tree`, `update-ref`: the review branch),
which never touches its working tree, index, HEAD or stash. Git runs without the user's or the system's
config, so hooks, pagers and `safe.directory` rules never change a result."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr


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
        stderr = result.stderr.decode(errors="replace")
        raise GitError(f"git {' '.join(args)} failed in {repo}: {stderr}", stderr.strip())
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


# ---------------------------------------------------------------------------------------------------------
# Writing commits with plumbing (review branches): the user's working tree, index, HEAD and stash untouched
# ---------------------------------------------------------------------------------------------------------

# A repository's own config still applies (its object format, its refs): these keep it from running
# anything of its own (hooks on update-ref, an fsmonitor on index reads, gc) or signing our commits.
QUIET = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "commit.gpgSign=false",
    "-c",
    "gc.auto=0",
    "-c",
    "i18n.commitEncoding=UTF-8",
)
ZERO = "0" * 40


class Identity(Frozen):
    """Who writes a commit, and when (ISO 8601): fixed, so the same content makes the same commit."""

    name: str
    email: str
    when: str

    def env(self) -> dict[str, str]:
        return {
            "GIT_AUTHOR_NAME": self.name,
            "GIT_AUTHOR_EMAIL": self.email,
            "GIT_AUTHOR_DATE": self.when,
            "GIT_COMMITTER_NAME": self.name,
            "GIT_COMMITTER_EMAIL": self.email,
            "GIT_COMMITTER_DATE": self.when,
        }


class CommitInfo(Frozen):
    sha: str
    author_email: str
    committer_email: str
    message: str


def resolve(repo: Path, ref: str) -> str | None:
    """The commit `ref` names, or None when it names none."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").decode().strip() or None
    except GitError:
        return None


def blob_at(repo: Path, commit: str, path: str) -> str | None:
    """The blob of the regular file at `path` in `commit`; None when there is none (or a link, a folder)."""
    out = git(repo, "ls-tree", "-z", commit, "--", path).decode("utf-8", "surrogateescape").strip("\0")
    meta, _, found = out.partition("\t")
    if found != path:
        return None
    mode, kind, blob = meta.split(" ")
    return blob if kind == "blob" and mode in {"100644", "100755"} else None


def is_bare(repo: Path) -> bool:
    return git(repo, "rev-parse", "--is-bare-repository").decode().strip() == "true"


def is_shallow(repo: Path) -> bool:
    return git(repo, "rev-parse", "--is-shallow-repository").decode().strip() == "true"


def checked_out_branches(repo: Path) -> set[str]:
    """The refs (`refs/heads/...`) checked out in any worktree of the repository."""
    out = git(repo, "worktree", "list", "--porcelain").decode("utf-8", "replace")
    return {line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("branch ")}


def commits_not_in(repo: Path, tip: str, base: str) -> list[CommitInfo]:
    """The commits reachable from `tip` and not from `base`, oldest first."""
    fields = "%H%x00%ae%x00%ce%x00%B%x00%x00"
    out = git(repo, "log", "--reverse", f"--format={fields}", tip, f"^{base}", "--").decode(
        "utf-8", "replace"
    )
    found = []
    for record in filter(None, (r.strip("\n") for r in out.split("\0\0"))):
        sha, author, committer, message = record.split("\0", 3)
        found.append(CommitInfo(sha=sha, author_email=author, committer_email=committer, message=message))
    return found


class ScratchIndex:
    """An index of its own (GIT_INDEX_FILE) in a temporary folder: trees are built and patches applied
    there (`git apply --cached`), never in the repository's index or working tree; bare repositories too."""

    def __init__(self, repo: Path, folder: Path) -> None:
        self.repo = repo
        self.env = {"GIT_INDEX_FILE": str(folder / "index")}

    def git(self, *args: str, input: bytes | None = None) -> bytes:
        return git(self.repo, *QUIET, *args, input=input, env=self.env)

    def reset(self, tree: str) -> None:
        self.git("read-tree", tree)

    def put(self, path: str, content: bytes, mode: str = "100644") -> None:
        blob = self.git("hash-object", "-w", "--stdin", input=content).decode().strip()
        self.git("update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}")

    def apply(self, patch: str) -> str:
        """'' when `patch` applied to the index, else git's reason."""
        try:
            self.git("apply", "--cached", "--whitespace=nowarn", "-", input=patch.encode("utf-8"))
        except GitError as exc:
            return exc.stderr or str(exc)
        return ""

    def read(self, path: str) -> bytes | None:
        """The content of `path` in the index, None when it has none."""
        out = self.git("ls-files", "--stage", "-z", "--", path).decode("utf-8", "surrogateescape")
        # Each entry is "<mode> <blob> <stage>\t<path>".
        blobs = [e.split(" ")[1] for e in out.split("\0") if e.endswith(f"\t{path}")]
        return read_blobs(self.repo, blobs)[blobs[0]] if blobs else None

    def write_tree(self) -> str:
        return self.git("write-tree").decode().strip()


@contextmanager
def scratch_index(repo: Path, commit: str) -> Iterator[ScratchIndex]:
    """A ScratchIndex holding `commit`'s tree, deleted on exit."""
    with tempfile.TemporaryDirectory(prefix="lanes-index-") as folder:
        index = ScratchIndex(repo, Path(folder))
        index.reset(f"{commit}^{{tree}}")
        yield index


def merge_texts(ours: str, base: str, theirs: str) -> tuple[str, int]:
    """`git merge-file` of two texts changed from `base`: (the merged text, how many conflicts it holds)."""
    with tempfile.TemporaryDirectory(prefix="lanes-merge-") as folder:
        paths = []
        for name, text in (("ours", ours), ("base", base), ("theirs", theirs)):
            path = Path(folder) / name
            path.write_text(text, encoding="utf-8")
            paths.append(str(path))
        command = ["git", "merge-file", "-p", "-L", "ours", "-L", "base", "-L", "theirs", *paths]
        result = subprocess.run(command, capture_output=True, env=_git_env(), cwd=folder, check=False)
    if result.returncode < 0 or result.returncode > 127:
        raise GitError(f"git merge-file failed: {result.stderr.decode(errors='replace')}")
    return result.stdout.decode("utf-8", "replace"), result.returncode


def tree_id(repo: Path, commit: str) -> str:
    return git(repo, "rev-parse", f"{commit}^{{tree}}").decode().strip()


def commit_tree(repo: Path, tree: str, parent: str, message: str, identity: Identity) -> str:
    """A commit object (no ref moves): the same tree, parent, message and identity give the same hash."""
    out = git(repo, *QUIET, "commit-tree", tree, "-p", parent, input=message.encode(), env=identity.env())
    return out.decode().strip()


def move_ref(repo: Path, ref: str, new: str, old: str | None, reason: str) -> None:
    """Point `ref` at `new` only if it still points at `old` (None: only if it does not exist yet)."""
    git(repo, *QUIET, "update-ref", "-m", reason, ref, new, old or ZERO)


def delete_ref(repo: Path, ref: str, old: str, reason: str) -> None:
    """Delete `ref` only if it still points at `old`."""
    git(repo, *QUIET, "update-ref", "-m", reason, "-d", ref, old)


def format_patch(repo: Path, base: str, tip: str, folder: Path) -> list[Path]:
    """The commits `base..tip` as a patch series (`git am` takes it) in `folder`, one file per commit."""
    folder.mkdir(parents=True, exist_ok=True)
    out = git(repo, *QUIET, "format-patch", "--no-signature", "-o", str(folder), f"{base}..{tip}")
    return [Path(line) for line in out.decode().splitlines() if line.strip()]

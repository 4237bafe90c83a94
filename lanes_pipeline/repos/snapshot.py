"""A git repository as it was at the end of one day: commit, inventory, changes, left-out files, repo map.

The commit is chosen by date (`git rev-list -1 --before=<end of day D> <branch>`), never by "whatever is
checked out", so a backfill of an old day sees the repository as it was that day. Everything is read from
git objects (`ls-tree`, `cat-file`), not from the working tree: uncommitted edits and the current checkout
never leak into a snapshot.

The first half of this module is pure (selection rules, outlines, the repo map); the second half reads
the day's commit through `git.py`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, time, timedelta
from pathlib import Path, PurePosixPath
from typing import Literal
from zoneinfo import ZoneInfo

import pathspec
from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.git import TreeEntry, commit_as_of, commit_time, ls_tree, read_blobs
from lanes_pipeline.sandbox.python_source import parse_python
from lanes_pipeline.sandbox.safety import (
    SHAPELESS_SECRETS,
    injection_markers,
    redact_secrets,
    secret_findings,
)
from lanes_pipeline.store import ArtifactStore

# ---------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------

LeftOutReason = Literal[
    "binary", "vendored", "too_large", "git_ignored", "prompt_injection", "secret", "not_utf8"
]


class FileEntry(Frozen):
    path: str
    blob: str = Field(description="git blob hash: equal blobs have equal content")
    language: str
    size: int
    redacted: list[str] = Field(
        [],
        description="the type of each random-looking value (SHAPELESS_SECRETS) the file holds, never the "
        "value: the file stays in the day, and prompts show these values redacted (redact_secrets)",
    )


class LeftOut(Frozen):
    path: str
    reason: LeftOutReason
    detail: str = ""


class ModuleOutline(Frozen):
    """Classes, functions and methods of one Python module, as signatures."""

    path: str
    module: str
    functions: list[str] = Field(default_factory=list)
    classes: list[tuple[str, list[str]]] = Field(default_factory=list)  # (class header, method signatures)
    error: str | None = None

    def defined_names(self) -> set[str]:
        """Every function, class and method name the module defines."""
        names = {f.split("(", 1)[0].removeprefix("async ") for f in self.functions}
        for header, methods in self.classes:
            names.add(header.split("(", 1)[0].removeprefix("class "))
            names |= {m.split("(", 1)[0].removeprefix("async ") for m in methods}
        return names

    def public_names(self) -> list[str]:
        names = [f.split("(", 1)[0] for f in self.functions]
        names += [header.split("(", 1)[0].removeprefix("class ") for header, _ in self.classes]
        return [n for n in names if not n.startswith("_")]


class SelectionRules(Frozen):
    """What a snapshot reads: a repos.yaml entry's globs and cpu_assets.max_file_bytes (defaults there),
    which limits files other than Python source (see is_python)."""

    include: list[str]
    exclude: list[str]
    max_file_bytes: int


class Snapshot(Frozen):
    """What `repo_snapshot` records for one repository and one day."""

    repo: str
    day: date
    branch: str
    commit: str | None = Field(description="None: the repository had no commit yet at the end of the day")
    commit_time: str | None = None
    previous_commit: str | None = None
    files: list[FileEntry] = Field(default_factory=list)
    changed: list[str] = Field([], description="selected paths added or modified since the previous day")
    deleted: list[str] = Field(default_factory=list)
    left_out: list[LeftOut] = Field(default_factory=list)
    not_included: int = Field(0, description="tracked files outside include/exclude")
    outlines: list[ModuleOutline] = Field(default_factory=list)
    repo_map: str = ""

    def file(self, path: str) -> FileEntry:
        return next(f for f in self.files if f.path == path)

    def redactions(self) -> dict[str, list[str]]:
        """path -> the type of each value redacted in the prompts' text of that file."""
        return {f.path: f.redacted for f in self.files if f.redacted}

    def code_paths(self) -> set[str]:
        """The Python files that are not tests: the ones whose symbols the pipeline works on."""
        return {f.path for f in self.files if f.language == "python" and not is_test_path(f.path)}


# ---------------------------------------------------------------------------------------------------------
# Pure rules
# ---------------------------------------------------------------------------------------------------------

LANGUAGES = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".ts": "typescript",
    ".tsx": "typescript",
    ".rs": "rust",
    ".go": "go",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".java": "java",
    ".sh": "shell",
    ".md": "markdown",
    ".rst": "rst",
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".cfg": "ini",
    ".ini": "ini",
    ".txt": "text",
}
VENDORED_DIRS = frozenset(
    {
        "vendor",
        "vendored",
        "_vendor",
        "third_party",
        "thirdparty",
        "node_modules",
        "site-packages",
        ".venv",
        "venv",
        "dist",
        "build",
        "__pycache__",
        ".tox",
        ".eggs",
    }
)
VENDORED_SUFFIXES = (".min.js", ".min.css", ".lock", "-lock.json")


def language_of(path: str) -> str:
    return LANGUAGES.get(PurePosixPath(path).suffix.lower(), "other")


def is_python(path: str) -> bool:
    """Python source has no size limit: the CPU lane works on it symbol by symbol (symbols.py), so a module
    of any size is covered; only other files are left out as too large."""
    return language_of(path) == "python"


def end_of_day(day: date, timezone: str) -> datetime:
    """The first instant of the next day in `timezone`: commits strictly before it belong to `day`."""
    return datetime.combine(day + timedelta(days=1), time(0), tzinfo=ZoneInfo(timezone))


def path_spec(patterns: Sequence[str]) -> pathspec.GitIgnoreSpec:
    """Gitignore-style patterns (`**` crosses folders); the same dialect as `.gitignore`, so no surprises."""
    return pathspec.GitIgnoreSpec.from_lines(patterns)


def is_vendored(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return any(part in VENDORED_DIRS for part in parts[:-1]) or path.endswith(VENDORED_SUFFIXES)


def is_binary(data: bytes) -> bool:
    """git's own heuristic: a NUL byte in the first 8000 bytes."""
    return b"\0" in data[:8000]


def ignored_paths(paths: Iterable[str], gitignores: Mapping[str, str]) -> set[str]:
    """Paths that the commit's own `.gitignore` files ignore (tracked anyway, e.g. force-added).

    `gitignores` maps the folder of each `.gitignore` ('' for the root) to its text; a nested file's
    patterns apply relative to its folder, as git applies them.
    """
    specs = {
        folder: pathspec.GitIgnoreSpec.from_lines(text.splitlines()) for folder, text in gitignores.items()
    }
    ignored = set()
    for path in paths:
        for folder, spec in specs.items():
            prefix = f"{folder}/" if folder else ""
            if path.startswith(prefix) and spec.match_file(path[len(prefix) :]):
                ignored.add(path)
                break
    return ignored


# Why a blob's text is left out (None: it is not), by blob: the same content is judged once a snapshot. For a
# file kept, the detail lists the types of the values its prompts' text shows redacted, ", "-separated.
ContentReasons = dict[str, tuple[LeftOutReason | None, str]]


def select_files(
    entries: Sequence[TreeEntry],
    rules: SelectionRules,
    read: Mapping[str, bytes],
    gitignores: Mapping[str, str],
    judged: ContentReasons | None = None,
) -> tuple[list[FileEntry], list[LeftOut], int]:
    """Split a tree into files the CPU lane works on, files left out (with the reason), and a count of
    files outside include/exclude. `read` holds the content of every included blob that is not too large;
    `judged` remembers the content checks by blob (the previous day's tree shares most of today's)."""
    judged = {} if judged is None else judged
    include, exclude = path_spec(rules.include), path_spec(rules.exclude)
    included = [e for e in entries if include.match_file(e.path) and not exclude.match_file(e.path)]
    ignored = ignored_paths((e.path for e in included), gitignores)
    files: list[FileEntry] = []
    left_out: list[LeftOut] = []
    for entry in sorted(included, key=lambda e: e.path):
        reason, detail = _left_out_reason(entry, rules, read.get(entry.blob), entry.path in ignored, judged)
        if reason is not None:
            left_out.append(LeftOut(path=entry.path, reason=reason, detail=detail))
        else:
            files.append(
                FileEntry(
                    path=entry.path,
                    blob=entry.blob,
                    language=language_of(entry.path),
                    size=entry.size,
                    redacted=detail.split(", ") if detail else [],
                )
            )
    return files, left_out, len(entries) - len(included)


def _left_out_reason(
    entry: TreeEntry, rules: SelectionRules, data: bytes | None, ignored: bool, judged: ContentReasons
) -> tuple[LeftOutReason | None, str]:
    if entry.mode == "120000":  # a symbolic link: its target could point anywhere, even outside the repo
        return "binary", "symbolic link"
    if ignored:
        return "git_ignored", "matched by the commit's .gitignore"
    if is_vendored(entry.path):
        return "vendored", "third-party or generated folder"
    if entry.size > rules.max_file_bytes and not is_python(entry.path):
        return "too_large", f"{entry.size} bytes > {rules.max_file_bytes}"
    if data is None or is_binary(data):
        return "binary", "contains NUL bytes"
    if entry.blob not in judged:
        judged[entry.blob] = _content_reason(data)
    return judged[entry.blob]


def _content_reason(data: bytes) -> tuple[LeftOutReason | None, str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "not_utf8", "not valid UTF-8"
    markers = injection_markers(text)
    if markers:
        # Never shown to the model, never in the dataset: text that tries to steer the model is quarantined.
        return "prompt_injection", "; ".join(markers[:3])
    found = secret_findings(text)
    secrets = [kind for kind in found if kind not in SHAPELESS_SECRETS]
    if secrets:
        # A key committed by mistake: the file is named (with the kind of key, never its value) so the user
        # can rotate it; no prompt carries it, so no answer, artifact or dataset row can.
        return "secret", ", ".join(secrets)
    if found:
        # Random-looking only (a hash, a test vector): the file stays, its values are redacted in prompts.
        return None, ", ".join(redact_secrets(text)[1])
    return None, ""


def changed_paths(previous: Mapping[str, str], current: Sequence[FileEntry]) -> tuple[list[str], list[str]]:
    """(added or modified, deleted) selected paths between two days' path -> blob maps."""
    now = {f.path: f.blob for f in current}
    changed = sorted(p for p, blob in now.items() if previous.get(p) != blob)
    deleted = sorted(p for p in previous if p not in now)
    return changed, deleted


def module_name(path: str) -> str:
    """`pkg/mod.py` -> `pkg.mod`, `src/pkg/__init__.py` -> `pkg` (the src layout is on sys.path)."""
    parts = list(PurePosixPath(path).with_suffix("").parts)
    if parts and parts[0] == "src":
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    prefix = "async " if isinstance(node, ast.AsyncFunctionDef) else ""
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    return f"{prefix}{node.name}({ast.unparse(node.args)}){returns}"


def python_outline(path: str, source: str) -> ModuleOutline:
    """Top-level functions and classes (with their methods) of a module, from Python's own parser."""
    try:
        tree = parse_python(source, filename=path)
    except (SyntaxError, ValueError) as exc:
        return ModuleOutline(path=path, module=module_name(path), error=f"unparseable: {exc}")
    functions: list[str] = []
    classes: list[tuple[str, list[str]]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.append(_signature(node))
        elif isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(b) for b in node.bases)
            header = f"class {node.name}({bases})" if bases else f"class {node.name}"
            methods = [
                _signature(item)
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            classes.append((header, methods))
    return ModuleOutline(path=path, module=module_name(path), functions=functions, classes=classes)


def _redacted_outline(outline: ModuleOutline, redact: bool) -> ModuleOutline:
    """The outline with the secret values in its signatures (a default argument) redacted: the snapshot's
    artifact and the repo map show it. Only for a file the content check found values in."""
    if not redact:
        return outline
    clean = lambda text: redact_secrets(text)[0]  # noqa: E731
    return outline.model_copy(
        update={
            "functions": [clean(f) for f in outline.functions],
            "classes": [(clean(header), [clean(m) for m in methods]) for header, methods in outline.classes],
        }
    )


def render_repo_map(repo: str, outlines: Sequence[ModuleOutline], max_chars: int) -> str:
    """The outline of the whole repository as compact text: the shared prompt prefix of every CPU-lane task.

    Deterministic (sorted by path) so the prefix is byte-identical between runs and the server's prefix
    cache hits; cut at a whole file when over `max_chars`, saying how many files were left out.
    """
    lines = [f"Repository {repo}:"]
    blocks = []
    for outline in sorted(outlines, key=lambda o: o.path):
        block = [f"{outline.path} ({outline.module})"]
        if outline.error:
            block.append("  (could not be parsed)")
        block += [f"  def {f}" for f in outline.functions]
        for header, methods in outline.classes:
            block.append(f"  {header}")
            block += [f"    def {m}" for m in methods]
        blocks.append("\n".join(block))
    used = len(lines[0])
    for index, block in enumerate(blocks):
        if used + len(block) + 1 > max_chars:
            lines.append(f"... {len(blocks) - index} more files not shown")
            break
        lines.append(block)
        used += len(block) + 1
    return "\n".join(lines)


def is_test_path(path: str) -> bool:
    name = PurePosixPath(path).name
    parts = PurePosixPath(path).parts
    return (
        name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
        or any(p in {"tests", "test", "testing"} for p in parts[:-1])
    )


# ---------------------------------------------------------------------------------------------------------
# The day's commit, read through git.py (I/O)
# ---------------------------------------------------------------------------------------------------------


def _gitignores(repo: Path, entries: Sequence[TreeEntry]) -> dict[str, str]:
    files = {e.blob: e.path for e in entries if PurePosixPath(e.path).name == ".gitignore"}
    texts = read_blobs(repo, files)
    folders = {blob: str(PurePosixPath(path).parent) for blob, path in files.items()}
    return {
        ("" if folder == "." else folder): texts[blob].decode("utf-8", "replace")
        for blob, folder in folders.items()
    }


def selected_files(
    repo: Path, commit: str, rules: SelectionRules, judged: ContentReasons | None = None
) -> tuple[list[FileEntry], list[LeftOut], int, dict[str, bytes]]:
    entries = ls_tree(repo, commit)
    include, exclude = path_spec(rules.include), path_spec(rules.exclude)
    readable = [
        e.blob
        for e in entries
        if include.match_file(e.path)
        and not exclude.match_file(e.path)
        and (e.size <= rules.max_file_bytes or is_python(e.path))
    ]
    contents = read_blobs(repo, readable)
    files, left_out, not_included = select_files(entries, rules, contents, _gitignores(repo, entries), judged)
    return files, left_out, not_included, contents


def take_snapshot(
    repo_name: str, repo: Path, branch: str, day: date, timezone: str, rules: SelectionRules, map_chars: int
) -> Snapshot:
    """The repository at the end of `day`, compared with the end of the day before."""
    commit = commit_as_of(repo, branch, end_of_day(day, timezone))
    if commit is None:
        return Snapshot(repo=repo_name, day=day, branch=branch, commit=None)
    judged: ContentReasons = {}  # the secret scan is the slow check: each blob once for both days
    files, left_out, not_included, contents = selected_files(repo, commit, rules, judged)
    previous = commit_as_of(repo, branch, end_of_day(day - timedelta(days=1), timezone))
    previous_blobs: dict[str, str] = {}
    if previous is not None:
        previous_blobs = {f.path: f.blob for f in selected_files(repo, previous, rules, judged)[0]}
    changed, deleted = changed_paths(previous_blobs, files)
    outlines = [
        _redacted_outline(python_outline(f.path, contents[f.blob].decode("utf-8")), bool(f.redacted))
        for f in files
        if f.language == "python"
    ]
    return Snapshot(
        repo=repo_name,
        day=day,
        branch=branch,
        commit=commit,
        commit_time=commit_time(repo, commit),
        previous_commit=previous,
        files=files,
        changed=changed,
        deleted=deleted,
        left_out=left_out,
        not_included=not_included,
        outlines=outlines,
        # Outlines show signatures, whose defaults may hold a value the prompts must not show.
        repo_map=redact_secrets(render_repo_map(repo_name, outlines, map_chars))[0],
    )


def load_snapshots(store: ArtifactStore, day: str) -> list[Snapshot]:
    """repo_snapshot's partition of the day, as it wrote it."""
    data = store.read_json("repo_snapshot", day, "snapshots.json")
    return [Snapshot.model_validate(item) for item in data]

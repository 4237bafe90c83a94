"""The anchor set: "write the body" problems from real packages nobody here wrote, judged by their own tests.

The user's repositories hold too few held-out functions (about 20) for a paired test to see a 10-point gain,
and HumanEval measures something else (self-contained puzzles, and a set every model has seen). The anchor
set is a fixed list of about 250 top-level functions of small pure-Python packages from PyPI, each with the
package's own tests that fail when its body is gutted and pass on the real code (tools/build_anchor_set.py
found them and wrote `anchor_packages/anchors.json`). Each anchor IS a `HeldOutFunction`: repo_tasks renders
and judges it exactly as it does the user's held-out functions, so both figures measure the same skill.

The sdists are vendored byte for byte as PyPI serves them (their sha256 is in the manifest and checked on
every extraction), and each becomes a git repository with one commit of fixed author and date, so an
anchor's commit is the same on every machine. Whether a function's tests pass on its real code depends on
the machine (the Python version, the sandbox), so that is checked once per machine, in the sandbox, and the
anchors whose reference fails are named in `not_tasks` rather than judged.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lanes_pipeline.dataset.holdout_rules import HeldOutFunction
from lanes_pipeline.git import CommitSpec, GitError, build_history, git, ls_tree
from lanes_pipeline.gpu_lane.repo_tasks import task_name
from lanes_pipeline.repos.scan import function_stub, symbols_at
from lanes_pipeline.repos.snapshot import is_test_path
from lanes_pipeline.sandbox.isolation import Isolation, open_sandbox
from lanes_pipeline.sandbox.outcomes import run_pytest_outcomes
from lanes_pipeline.settings import SandboxLimits

PACKAGES_DIR = Path(__file__).with_name("anchor_packages")
MANIFEST_FILE = "anchors.json"
ANCHOR_DIR = "anchor_set"  # under the data root: the packages' repositories and the reference checks
# A fixed author and date make each package's one commit the same SHA on every machine.
COMMIT_DATE = datetime(2024, 1, 1, tzinfo=UTC)
COMMIT_AUTHOR = "lanes anchor set"
# Bumped when the way a repository is made from its sdist changes, so existing ones are rebuilt.
REPO_FORMAT = "1"
STAMP = "lanes-anchor-stamp"  # inside .git: what the repository was built from (git archive never exports it)


class AnchorSetError(ValueError):
    """The vendored anchor set is not what its manifest says (names the file or key that is wrong)."""


class AnchorPackage(BaseModel):
    """One vendored sdist."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="as PyPI spells it")
    version: str
    sdist: str = Field(description="file name in anchor_packages/, byte-identical to PyPI's")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    licence: str
    omit: dict[str, str] = Field(
        {},
        description="paths inside the sdist (below its top folder) left out of the repository -> why "
        "(e.g. a conftest.py the project's pytest cannot load)",
    )

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.version}"


class AnchorTask(BaseModel):
    """One function and the package's tests that judge an answer for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    package: str
    path: str = Field(description="the module, relative to the sdist's top folder")
    symbol: str = Field(description="the symbol id as repos.scan.symbols_at names it (`path::name`)")
    tests: list[str] = Field(
        min_length=1, description="pytest node ids: fail when gutted, pass on the real code"
    )


class AnchorManifest(BaseModel):
    """anchor_packages/anchors.json, written by tools/build_anchor_set.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    built_with: str = Field("", description="the Python and pytest the builder ran the tests with")
    packages: list[AnchorPackage]
    tasks: list[AnchorTask]
    left_out: dict[str, str] = Field(
        {}, description="symbol id of each candidate that is no task -> why (for review, never read)"
    )


class AnchorSet(BaseModel):
    """The anchors this machine can judge, in a fixed order (by task name)."""

    functions: list[HeldOutFunction]
    not_tasks: dict[str, str] = Field({}, description="task name -> why it is not judged here")
    fingerprint: str = Field(description="sha256 (16 hex) of the manifest and the tasks judged")


def anchor_repo_name(package: str) -> str:
    """The `repo` of an anchor's HeldOutFunction: its task names read `anchor:<package>:body:<symbol id>`."""
    return f"anchor:{package}"


def anchor_task_name(package: str, symbol_id: str) -> str:
    """repo_tasks.task_name of the anchor, also for the anchors that never become a HeldOutFunction."""
    return f"{anchor_repo_name(package)}:body:{symbol_id}"


def normalised(name: str) -> str:
    """PyPI's name normalisation (PEP 503): `More_Itertools` and `more.itertools` are `more-itertools`."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------------------------------------
# The manifest and the sdists (I/O)
# ---------------------------------------------------------------------------------------------------------


def load_manifest(folder: Path = PACKAGES_DIR) -> AnchorManifest:
    """The manifest, checked: every task's package is vendored, and no task is listed twice."""
    path = folder / MANIFEST_FILE
    try:
        manifest = AnchorManifest.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise AnchorSetError(f"{path}: not a readable anchor manifest: {exc}") from exc
    names = [p.name for p in manifest.packages]
    if len(set(names)) != len(names):
        raise AnchorSetError(f"{path}: a package is listed twice in `packages`: {sorted(names)}")
    seen: set[tuple[str, str]] = set()
    for task in manifest.tasks:
        if task.package not in names:
            raise AnchorSetError(f"{path}: task {task.symbol!r} names package {task.package!r}, not vendored")
        if (task.package, task.symbol) in seen:
            raise AnchorSetError(f"{path}: task {task.package}:{task.symbol} is listed twice")
        seen.add((task.package, task.symbol))
    return manifest


def sdist_bytes(package: AnchorPackage, folder: Path = PACKAGES_DIR) -> bytes:
    """The vendored sdist, only if its sha256 is the manifest's (a changed tarball would change the tasks)."""
    path = folder / package.sdist
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AnchorSetError(f"{path}: the vendored sdist of {package.name} cannot be read: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != package.sha256:
        raise AnchorSetError(
            f"{path}: sha256 {digest} is not the manifest's {package.sha256} for {package.folder_name}"
        )
    return data


def sdist_files(package: AnchorPackage, data: bytes) -> dict[str, str]:
    """The sdist's text files, path (below its top folder) -> text, less `omit`. Binary files (a stray
    `.pyc`) are left out: the repository is built from text, and no test reads them."""
    files: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        top = PurePosixPath(members[0].name).parts[0] if members else ""  # `name-version`, however spelt
        for member in members:
            parts = PurePosixPath(member.name).parts
            if parts[:1] != (top,) or len(parts) < 2 or ".." in parts:
                raise AnchorSetError(f"{package.sdist}: member {member.name!r} is not below {top}/")
            rel = "/".join(parts[1:])
            if any(rel == o or rel.startswith(o.rstrip("/") + "/") for o in package.omit):
                continue
            handle = tar.extractfile(member)
            assert handle is not None  # a regular file always has one
            try:
                files[rel] = handle.read().decode("utf-8")
            except UnicodeDecodeError:
                continue
    return files


def _stamp(package: AnchorPackage) -> str:
    return json.dumps([REPO_FORMAT, package.sha256, sorted(package.omit)])


def _head(repo: Path) -> str | None:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}").decode().strip() or None
    except GitError:
        return None


def package_repo(package: AnchorPackage, root: Path, folder: Path = PACKAGES_DIR) -> tuple[Path, str]:
    """The package's git repository under `root/anchor_set/` and its one commit, built if missing or built
    from something else; the sdist's sha256 is checked either way (cheap, and a tampered file must fail).

    Runs that start at once check and build under one lock file (as sample_repo does): without it, one
    could replace the repository while another reads it."""
    data = sdist_bytes(package, folder)
    target = root / ANCHOR_DIR / package.folder_name
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        stamp = target / ".git" / STAMP
        if stamp.is_file() and stamp.read_text(encoding="utf-8") == _stamp(package):
            head = _head(target)
            if head is not None:
                return target, head
        # Built beside the target and moved into place: a build cut short never looks finished.
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            spec = CommitSpec(
                when=COMMIT_DATE,
                message=f"{package.folder_name} from {package.sdist} (sha256 {package.sha256})\n",
                files=dict(sorted(sdist_files(package, data).items())),
            )
            commit = build_history(staging / "repo", [spec], author=COMMIT_AUTHOR)
            (staging / "repo" / ".git" / STAMP).write_text(_stamp(package), encoding="utf-8")
            if target.exists():
                shutil.rmtree(target)
            (staging / "repo").rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target, commit


def anchor_repos(root: Path, folder: Path = PACKAGES_DIR) -> dict[str, tuple[Path, str]]:
    """Package name -> (its git repository, its commit), for every vendored package."""
    return {p.name: package_repo(p, root, folder) for p in load_manifest(folder).packages}


# ---------------------------------------------------------------------------------------------------------
# The tasks, and the check of their references on this machine
# ---------------------------------------------------------------------------------------------------------


def _fingerprint(manifest_bytes: bytes, functions: Sequence[HeldOutFunction]) -> str:
    # The repository's location differs between machines and says nothing about the task: left out.
    tasks = [f.model_dump(mode="json", exclude={"location"}) for f in functions]
    payload = json.dumps(tasks, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(manifest_bytes + b"\0" + payload).hexdigest()[:16]


def _package_modules(location: Path, commit: str, tasks: Sequence[AnchorTask]) -> list[str]:
    """The non-test modules of the packages the tasks are in (`toolz/**.py`, not `setup.py`, `docs/` or
    `versioneer.py`): a symbol's context shows the stubs of what it calls across them, as a user's repository
    task would, without the time (and the warnings of old code) of parsing the rest of the sdist."""
    tops = {PurePosixPath(t.path).parts[0] for t in tasks}
    return [
        e.path
        for e in ls_tree(location, commit)
        if e.path.endswith(".py") and PurePosixPath(e.path).parts[0] in tops and not is_test_path(e.path)
    ]


def _candidates(
    manifest: AnchorManifest, repos: Mapping[str, tuple[Path, str]]
) -> tuple[list[HeldOutFunction], dict[str, str]]:
    """Each task of a package in `repos` as a HeldOutFunction, or why it cannot be one (its symbol is
    missing: the manifest and the sdist disagree)."""
    functions: list[HeldOutFunction] = []
    missing: dict[str, str] = {}
    for package in manifest.packages:
        if package.name not in repos:
            continue
        location, commit = repos[package.name]
        tasks = [t for t in manifest.tasks if t.package == package.name]
        found = symbols_at(location, commit, _package_modules(location, commit, tasks))
        by_id = found.by_id()
        for task in tasks:
            symbol = by_id.get(task.symbol)
            name = anchor_task_name(package.name, task.symbol)
            if symbol is None or symbol.kind != "function":
                why = found.skipped.get(task.symbol) or found.left_out.get(task.path) or "not in the module"
                missing[name] = f"no function {task.symbol} at {commit[:12]}: {why}"
                continue
            functions.append(
                HeldOutFunction(
                    repo=anchor_repo_name(package.name),
                    location=str(location),
                    commit=commit,
                    symbol=symbol,
                    stub=function_stub(symbol),
                    repo_tests=list(task.tests),
                    cpu_tests=[],
                )
            )
    return functions, missing


def _read_checked(path: Path) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or cut short while written: checked again
    return data if isinstance(data, dict) else {}


def _check_references(
    functions: Sequence[HeldOutFunction],
    cache: Path,
    limits: SandboxLimits,
    isolation: Isolation | None,
) -> dict[str, dict[str, str]]:
    """Package repo -> node id -> outcome of its tasks' tests on the real code, one sandboxed pytest run
    per package (as held_out_tasks._outcomes runs a repository's), cached in `cache` once they gave a
    report (a run that gave none, e.g. killed at the time limit on a busy machine, is tried again)."""
    checked = _read_checked(cache)
    by_repo: dict[str, list[HeldOutFunction]] = {}
    for function in functions:
        by_repo.setdefault(function.repo, []).append(function)
    fresh = False
    for repo, group in sorted(by_repo.items()):
        if repo in checked:
            continue
        wanted = sorted({t for f in group for t in f.repo_tests})
        with open_sandbox(Path(group[0].location), group[0].commit, limits, isolation) as sandbox:
            outcomes = run_pytest_outcomes(sandbox, wanted)
        if outcomes:
            checked[repo], fresh = outcomes, True
        else:
            checked[repo] = {}
    if fresh:
        kept = {repo: outcomes for repo, outcomes in checked.items() if outcomes}
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(kept, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(partial, cache)
    return checked


def reference_problem(function: HeldOutFunction, outcomes: Mapping[str, str] | None) -> str | None:
    """Why the function's own tests do not vouch for it here (None: all passed on the real code). Pure."""
    if not outcomes:
        return "its package's tests gave no report in the sandbox (killed at the time limit, or crashed)"
    failing = [t for t in function.repo_tests if outcomes.get(t) != "passed"]
    if not failing:
        return None
    first = failing[0]
    return (
        f"its reference fails {len(failing)} of its {len(function.repo_tests)} tests on this machine: "
        f"{first} ({outcomes.get(first, 'not run')})"
    )


def load_anchor_set(
    root: Path,
    limits: SandboxLimits,
    exclude: Collection[str] = (),
    isolation: Isolation | None = None,
    folder: Path = PACKAGES_DIR,
) -> AnchorSet:
    """The anchors to judge on this machine. `exclude` names the user's repositories: a package of the same
    name (normalised) is never judged, since the adapter trains on it. The first call on a machine runs the
    reference check (seconds per package); later ones read it from `root/anchor_set/checked-<key>.json`,
    whose key covers the manifest and the Python that ran them (a package excluded then is checked when
    it no longer is)."""
    manifest = load_manifest(folder)
    manifest_bytes = (folder / MANIFEST_FILE).read_bytes()
    excluded_names = {normalised(e) for e in exclude}
    not_tasks: dict[str, str] = {}
    kept = []
    for package in manifest.packages:
        if normalised(package.name) in excluded_names:
            why = f"package {package.name} is excluded: a repository the adapter trains on has its name"
            for task in manifest.tasks:
                if task.package == package.name:
                    not_tasks[anchor_task_name(package.name, task.symbol)] = why
        else:
            kept.append(package)
    repos = {p.name: package_repo(p, root, folder) for p in kept}
    candidates, missing = _candidates(manifest, repos)
    not_tasks |= missing
    # What the outcomes depend on: the tests and sdists (the manifest) and the Python that runs them.
    key = hashlib.sha256(manifest_bytes + sys.version.encode()).hexdigest()[:16]
    checked = _check_references(candidates, root / ANCHOR_DIR / f"checked-{key}.json", limits, isolation)
    functions = []
    for function in candidates:
        problem = reference_problem(function, checked.get(function.repo))
        if problem is None:
            functions.append(function)
        else:
            not_tasks[task_name(function)] = problem
    functions.sort(key=task_name)
    return AnchorSet(
        functions=functions,
        not_tasks=dict(sorted(not_tasks.items())),
        fingerprint=_fingerprint(manifest_bytes, functions),
    )


def anchor_subset(functions: Sequence[HeldOutFunction], n: int | None) -> list[HeldOutFunction]:
    """The `n` tasks whose names hash lowest (the same every day and on every machine, and a mix of the
    packages, where the first `n` by name would take whole packages), in name order; None: all. Pure."""
    if n is None:
        return list(functions)
    chosen = sorted(functions, key=lambda f: hashlib.sha256(task_name(f).encode()).hexdigest())[:n]
    return sorted(chosen, key=task_name)

"""`real_package`: the CPU lane on real code nobody here wrote (issue 11, item 7 and its targets).

A git repository is built from successive releases of a real pure-Python package from PyPI, one release
per day as a dated commit (noon UTC of consecutive days from `pipeline.yaml`'s start_date), each commit the
release's tree as its sdist ships it: Python source and tests, the dependency files repo_env reads
(pyproject.toml, setup.cfg, requirements*.txt) and the licence; metadata and docs (PKG-INFO, egg-info,
changelogs) are left out. The sdists come through pip (`pip download --no-binary :all:`), so pip's cache
serves a second build without the network.

The package is `decorator` 5.0.9, 5.1.0, 5.1.1: pure Python, no dependencies, its tests in the sdist, one
module (`src/decorator.py`, 16.2-16.8 KB) larger than the shipped `cpu_assets.max_file_bytes` (16000), 11-12
symbols, and edits between releases that touch only a few of them (5.1.0: `decoratorx` new, `decorator` and
`ContextManager` edited; 5.1.1: `ContextManager` and `FunctionMaker.__init__` edited). The larger candidates
fit less: six's 1.16.0 adds an import, which changes every symbol's context (all 26 re-asked), semver 2.x
has 64 symbols (too slow for a test).

`run` backfills the days on the embedded lane from an empty LANES_DATA_DIR (as cpu_yield does) and reports,
per day, the repository's symbols, how many are covered (asked for tests in their current form on some day
so far) and which files the snapshot left out as too large; `coverage_report` turns those into
`left_out_for_size` and `days_to_full_coverage`, the issue's targets for this fixture.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.assets.common import read_results
from lanes_pipeline.cpu_lane.jobs.rows import GeneratedTestRow
from lanes_pipeline.embedded.engines import pip_sdist_download
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.repos.snapshot import LeftOut, Snapshot
from lanes_pipeline.settings import Settings, edit_config_file, load_settings
from lanes_pipeline.store import ArtifactStore

PACKAGE = "decorator"
RELEASES = ("5.0.9", "5.1.0", "5.1.1")
REPO_NAME = "real_package"
# What the CPU lane reads of it: the package's source; its own tests (src/tests/, with a 56 KB documentation
# module) still run in the sandbox and serve as examples, they are not themselves analysed.
INCLUDE = ["**/*.py"]
EXCLUDE = ["**/tests/**", "setup.py"]
_KEEP_NAMES = {"pyproject.toml", "setup.cfg"}


class RealPackageError(RuntimeError):
    """A release could not be fetched or read: names the package, the version and why."""


class Release(Frozen):
    version: str
    day: date
    commit: str


class ReleaseRepo(Frozen):
    """A repository built from a package's releases, one dated commit per day."""

    package: str
    path: Path
    releases: list[Release]

    def days(self) -> list[str]:
        return [r.day.isoformat() for r in self.releases]


class DayCoverage(Frozen):
    """One day of a backfill: the repository's symbols that day, how many are covered, what was left out."""

    day: str
    symbols: int
    covered: int = Field(description="symbols asked for tests in their current form, on this day or before")
    too_large: list[str] = Field([], description="files the snapshot left out as too_large")


class CoverageReport(Frozen):
    days: list[DayCoverage]
    left_out_for_size: list[str] = Field(description="every file left out as too_large on any day, sorted")
    days_to_full_coverage: int | None = Field(description="1-based: the first day every symbol is covered")
    full_coverage_on: str | None = None


# ---------------------------------------------------------------------------------------------------------
# Pure
# ---------------------------------------------------------------------------------------------------------


def kept(path: str) -> bool:
    """Whether a file of a release goes into its commit: source, tests, dependency files, the licence."""
    name = PurePosixPath(path).name
    parts = PurePosixPath(path).parts
    if any(p.endswith(".egg-info") for p in parts):
        return False
    return (
        path.endswith(".py")
        or name in _KEEP_NAMES
        or (name.startswith("requirements") and name.endswith(".txt"))
        or name.upper().startswith(("LICENSE", "LICENCE", "COPYING"))
    )


def release_days(first: date, count: int) -> list[date]:
    return [first + timedelta(days=i) for i in range(count)]


def covered_per_day(symbols: Sequence[Mapping[str, str]], targeted: Sequence[set[str]]) -> list[int]:
    """How many of each day's symbols are covered after that day. `symbols[d]`: symbol id -> memo key on
    day d; `targeted[d]`: the ids generated_tests asked for on day d. A symbol counts while the form it was
    asked in is still its form (an edit uncovers it until it is asked again), as the asset counts it."""
    asked: set[tuple[str, str]] = set()
    counts = []
    for today, ids in zip(symbols, targeted, strict=True):
        asked |= {(i, today[i]) for i in ids if i in today}
        counts.append(sum((i, key) in asked for i, key in today.items()))
    return counts


def coverage_report(days: Sequence[DayCoverage]) -> CoverageReport:
    """The figures of issue 11's targets for the real package: files left out for size (none wanted) and
    the first day when every symbol is covered (None: not within these days)."""
    full = next((i for i, d in enumerate(days) if d.symbols and d.covered == d.symbols), None)
    return CoverageReport(
        days=list(days),
        left_out_for_size=sorted({p for d in days for p in d.too_large}),
        days_to_full_coverage=None if full is None else full + 1,
        full_coverage_on=None if full is None else days[full].day,
    )


def repos_entry(repo: Path) -> dict[str, Any]:
    """The repos.yaml entry that points the CPU lane at a built release repository."""
    return {"name": REPO_NAME, "path": str(repo), "branch": "main", "include": INCLUDE, "exclude": EXCLUDE}


# ---------------------------------------------------------------------------------------------------------
# Fetching and building (I/O)
# ---------------------------------------------------------------------------------------------------------


def download_sdist(package: str, version: str, folder: Path) -> Path:
    """The release's sdist through pip (and its cache); a failure names the package, version and why."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        *pip_sdist_download(f"{package}=={version}", folder),
        "--no-input",
        "--disable-pip-version-check",
    ]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        raise RealPackageError(f"pip download of {package}=={version} timed out after 300 s") from None
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-5:])
        raise RealPackageError(f"pip could not download the sdist of {package}=={version}: {tail}")
    prefix = f"{package}-{version}".lower()
    found = [p for p in folder.iterdir() if p.name.lower().startswith(prefix) and p.name.endswith(".tar.gz")]
    if not found:
        raise RealPackageError(f"pip downloaded no .tar.gz sdist of {package}=={version} into {folder}")
    return found[0]


def release_files(sdist: Path) -> dict[str, str]:
    """The kept files of an sdist (its top folder stripped), path -> text."""
    files: dict[str, str] = {}
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar.getmembers():
                parts = PurePosixPath(member.name).parts
                if not member.isfile() or len(parts) < 2:
                    continue
                rel = PurePosixPath(*parts[1:]).as_posix()
                handle = tar.extractfile(member)
                if kept(rel) and handle is not None:
                    files[rel] = handle.read().decode("utf-8")
    except (tarfile.TarError, UnicodeDecodeError, OSError) as exc:
        raise RealPackageError(f"{sdist.name}: not a readable sdist ({exc})") from None
    if not any(p.endswith(".py") for p in files):
        raise RealPackageError(f"{sdist.name}: no Python file in the sdist")
    return files


def build_release_repo(
    repo: Path,
    downloads: Path,
    first_day: date,
    package: str = PACKAGE,
    releases: Sequence[str] = RELEASES,
) -> ReleaseRepo:
    """A git repository with one commit per release, at noon UTC of consecutive days from `first_day`;
    each commit is exactly the release's kept tree (files of the previous release it lacks are deleted)."""
    if (repo / ".git").exists():
        raise RealPackageError(f"{repo} already holds a repository: build into an empty folder")
    built: list[Release] = []
    previous: set[str] = set()
    for version, day in zip(releases, release_days(first_day, len(releases)), strict=True):
        files: dict[str, str | None] = dict(release_files(download_sdist(package, version, downloads)))
        files |= {gone: None for gone in previous - set(files)}
        when = datetime.combine(day, time(12), tzinfo=UTC)
        spec = CommitSpec(when=when, message=f"{package} {version}", files=files)
        commit = build_history(repo, [spec], author=f"{package} releases from PyPI")
        built.append(Release(version=version, day=day, commit=commit))
        previous = {p for p, text in files.items() if text is not None}
    return ReleaseRepo(package=package, path=repo, releases=built)


def write_project_configs(settings: Settings, target: Path, repo: Path, **cpu_assets: Any) -> Path:
    """A copy of the project's configs with repos.yaml pointing at `repo` alone and `cpu_assets` overrides."""
    shutil.copytree(settings.config_dir, target)
    (target / "repos.yaml").write_text(yaml.safe_dump({"repos": [repos_entry(repo)]}), encoding="utf-8")
    edit_config_file(target / "pipeline.yaml", {"cpu_assets": cpu_assets})
    return target


def day_coverage(store: ArtifactStore, built: ReleaseRepo) -> list[DayCoverage]:
    """Each day's coverage from what the assets stored: the snapshot's left-out files and the symbols
    generated_tests asked for, against the repository's symbols at that day's commit."""
    snapshots, symbols, targeted = [], [], []
    for day in built.days():
        snapshot = next(
            Snapshot.model_validate(s)
            for s in store.read_json("repo_snapshot", day, "snapshots.json")
            if s["repo"] == REPO_NAME
        )
        snapshots.append(snapshot)
        paths = snapshot.code_paths()
        found = symbols_at(built.path, snapshot.commit, paths).symbols if snapshot.commit else []
        symbols.append({s.id: s.memo_key for s in found})
        rows = read_results(store, "generated_tests", day, GeneratedTestRow)
        targeted.append({f"{r.path}::{r.symbol}" for r in rows if r.repo == REPO_NAME and r.symbol})
    covered = covered_per_day(symbols, targeted)
    return [
        DayCoverage(day=s.day.isoformat(), symbols=len(ids), covered=n, too_large=too_large(s.left_out))
        for s, ids, n in zip(snapshots, symbols, covered, strict=True)
    ]


def too_large(left_out: Sequence[LeftOut]) -> list[str]:
    return sorted(f.path for f in left_out if f.reason == "too_large")


def run(settings: Settings) -> dict[str, Any]:
    """Backfill the package's days on the embedded CPU lane from an empty data folder, with the shipped
    cpu_assets settings; the coverage report, as JSON."""
    from lanes_pipeline.bench.cpu_lane import _sigterm_unwinds
    from lanes_pipeline.bench.cpu_yield import _materialize, empty_data_dir
    from lanes_pipeline.embedded.servers import build_server

    with empty_data_dir(settings.data_dir) as root, _sigterm_unwinds():
        first = load_settings(settings.config_dir).pipeline.start_date
        with tempfile.TemporaryDirectory(prefix="lanes-sdists-") as downloads:
            built = build_release_repo(root / "repo", Path(downloads), first)
        fresh = load_settings(write_project_configs(settings, root / "configs", built.path))
        server = build_server(fresh, "cpu", port=0, publish=False)
        try:
            server.start()
            store, _ = _materialize(fresh, server.url, root, built.days())
            out = coverage_report(day_coverage(store, built))
        finally:
            server.stop()
    result = out.model_dump(mode="json")
    result |= {
        "package": built.package,
        "releases": [r.model_dump(mode="json", exclude={"commit"}) for r in built.releases],
        "markdown": markdown(out, built),
    }
    return result


def markdown(out: CoverageReport, built: ReleaseRepo) -> str:
    versions = ", ".join(f"{r.version} ({r.day})" for r in built.releases)
    lines = [
        f"CPU lane on `{built.package}` releases {versions}, one a day (embedded model):",
        "",
        "| day | symbols | covered | left out as too large |",
        "|---|---|---|---|",
    ]
    lines += [f"| {d.day} | {d.symbols} | {d.covered} | {', '.join(d.too_large) or '-'} |" for d in out.days]
    full = out.days_to_full_coverage
    lines += [
        "",
        f"Left out for size: {', '.join(out.left_out_for_size) or 'none'}; every symbol covered "
        + (f"on day {full} ({out.full_coverage_on})" if full else "NOT within these days"),
    ]
    return "\n".join(lines)

"""The CPU lane on real code nobody here wrote: `decorator`'s releases 5.0.9, 5.1.0 and 5.1.1 as three dated
commits (real_package.py), backfilled day by day through the whole CPU-lane chain with the real embedded
llama-server (SmolLM2-135M), from an empty data folder:

- each day's snapshot is that day's release commit, and no Python module is left out for size (its
  `src/decorator.py` is larger than the shipped max_file_bytes);
- later days ask only for the symbols the release edited, plus the backlog: the unchanged symbols asked
  before cost no request;
- the backlog advances: symbols never asked go down each day by the day's backlog budget;
- every accepted generated test passes again, run here in a fresh sandbox at that day's commit with the
  repository's own environment (repo_env), and every accepted refactor diff applies on that commit.

The model is tiny: zero accepted answers is a possible outcome, so the verification itself is asserted to
have happened (answers that reached the sandbox, diffs that were judged).
"""

from __future__ import annotations

import itertools
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, load_assets_from_modules, materialize

from lanes_pipeline.bench.cpu_yield import empty_data_dir
from lanes_pipeline.bench.real_package import (
    REPO_NAME,
    DayCoverage,
    RealPackageError,
    ReleaseRepo,
    coverage_report,
    covered_per_day,
    day_coverage,
    download_sdist,
    kept,
    write_project_configs,
)
from lanes_pipeline.cpu_lane.assets.common import read_results
from lanes_pipeline.cpu_lane.jobs.rows import GeneratedTestRow, RefactorRow
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.partitions import daily_partitions, partitioned_daily
from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.definitions import CPU_DAY_MODULES
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.git import git
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.repos.symbols import Symbol, diff_scans
from lanes_pipeline.sandbox.isolation import detect_isolation, export_commit, judge_test_file, open_sandbox
from lanes_pipeline.sandbox.repo_env import dependency_files_at, ensure_env, read_dependencies
from lanes_pipeline.settings import CpuLane, Settings, load_settings
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.cpu_lane.real_package import real_package_repo  # noqa: F401  (a fixture)

BACKLOG_PER_DAY = 1
SAMPLES = 2
MODULE = "src/decorator.py"
# What each release edited, by symbol (read off the releases' diffs): the symbols later days must ask.
EDITED = {
    1: {f"{MODULE}::decorator", f"{MODULE}::decoratorx", f"{MODULE}::ContextManager"},
    2: {f"{MODULE}::ContextManager", f"{MODULE}::FunctionMaker.__init__"},
}


# Three days of the whole chain with a real server, about ten symbols asked twice each: a few minutes on two
# idle cores (the module fixture's time counts against the first test).
SERVER_TIMEOUT = pytest.mark.timeout(1800)


@dataclass
class Backfill:
    repo: ReleaseRepo
    settings: Settings
    store: ArtifactStore
    data_dir: Path
    metadata: list[dict[str, dict[str, Any]]] = field(default_factory=list)

    def days(self) -> list[str]:
        return self.repo.days()

    def snapshot(self, day: str) -> Snapshot:
        found = self.store.read_json("repo_snapshot", day, "snapshots.json")
        return next(Snapshot.model_validate(s) for s in found if s["repo"] == REPO_NAME)

    def tests(self, day: str) -> list[GeneratedTestRow]:
        return [
            r
            for r in read_results(self.store, "generated_tests", day, GeneratedTestRow)
            if r.repo == REPO_NAME
        ]

    def diffs(self, day: str) -> list[RefactorRow]:
        return [
            r for r in read_results(self.store, "refactor_proposals", day, RefactorRow) if r.repo == REPO_NAME
        ]

    def symbols(self, index: int) -> list[Symbol]:
        commit = self.repo.releases[index].commit
        snap = self.snapshot(self.days()[index])
        paths = snap.code_paths()
        return symbols_at(self.repo.path, commit, paths).symbols


def _ids(rows: list[GeneratedTestRow]) -> set[str]:
    return {f"{r.path}::{r.symbol}" for r in rows}


@pytest.fixture(scope="module")
def backfill(
    tmp_path_factory: pytest.TempPathFactory,
    settings: Settings,
    cpu_server: EmbeddedServer,
    real_package_repo: ReleaseRepo,  # noqa: F811  (the fixture imported above)
) -> Iterator[Backfill]:
    root = tmp_path_factory.mktemp("real_package_backfill")
    config_dir = write_project_configs(
        settings,
        root / "configs",
        real_package_repo.path,
        backlog_per_day=BACKLOG_PER_DAY,
        samples_per_item=SAMPLES,
        analysis_max_tokens=128,
        tests_max_tokens=96,  # a few calls of the symbol: the oracles are written from what they return
        refactor_max_tokens=128,
        sandbox={"timeout_s": 30, "memory_mb": 1024, "runs": 3},
    )
    # An empty data folder the sandbox's uid can traverse: the repository's environment is built there.
    with empty_data_dir(settings.data_dir) as data_dir:
        project = load_settings(config_dir)
        store = ArtifactStore(root / "artifacts")
        resources = {
            "cpu_lane": CpuLaneResource(
                config=CpuLane(base_url=cpu_server.url, cache_path=str(root / "cache.sqlite3"))
            ),
            "artifact_store": ArtifactStoreResource(root=str(store.root)),
            "pipeline_settings": PipelineSettingsResource(config_dir=str(config_dir)),
            "lora_training": LoraTrainingResource.from_config(project.training),
        }
        assets = partitioned_daily(
            load_assets_from_modules(CPU_DAY_MODULES),
            daily_partitions(project),  # type: ignore[arg-type]
        )
        instance = DagsterInstance.ephemeral()
        done = Backfill(real_package_repo, project, store, data_dir)
        for day in real_package_repo.days():
            result = materialize(assets, resources=resources, partition_key=day, instance=instance)
            assert result.success, day
            done.metadata.append(
                {
                    e.asset_key.to_user_string(): {k: v.value for k, v in e.materialization.metadata.items()}
                    for e in result.get_asset_materialization_events()
                }
            )
        yield done


@SERVER_TIMEOUT
def test_each_day_snapshots_its_release_and_leaves_no_module_out_for_size(backfill: Backfill) -> None:
    limit = backfill.settings.pipeline.cpu_assets.max_file_bytes
    for release, metadata in zip(backfill.repo.releases, backfill.metadata, strict=True):
        day = release.day.isoformat()
        assert metadata["repo_snapshot"]["commits"] == {REPO_NAME: release.commit}, release.version
        snap = backfill.snapshot(day)
        assert snap.commit == release.commit
        python_out = [(f.path, f.reason, f.detail) for f in snap.left_out if f.path.endswith(".py")]
        assert python_out == [], f"{release.version}: Python modules left out: {python_out}"
        big = snap.file(MODULE)
        assert big.size > limit  # the module the size limit would have dropped is read, symbol by symbol
    assert [r.version for r in backfill.repo.releases] == ["5.0.9", "5.1.0", "5.1.1"]
    commits = [r.commit for r in backfill.repo.releases]
    assert [backfill.snapshot(d).previous_commit for d in backfill.days()] == [None, *commits[:-1]]


@SERVER_TIMEOUT
def test_later_days_ask_only_the_edited_symbols_and_the_backlog(backfill: Backfill) -> None:
    asked_before: set[str] = set()
    for index, day in enumerate(backfill.days()):
        rows, figures = backfill.tests(day), backfill.metadata[index]["generated_tests"]
        today = backfill.symbols(index)
        asked = _ids(rows)
        assert len(asked) == len(rows)  # one row per symbol asked
        if index:
            diff = diff_scans(backfill.symbols(index - 1), today)
            assert {*diff.new, *diff.changed} == EDITED[index]
            assert EDITED[index] <= asked  # every edited symbol is asked again
            unchanged_asked = set(diff.unchanged) & asked_before
            assert not unchanged_asked & asked, "an unchanged symbol asked before was asked again"
            backlog = asked - EDITED[index]
        else:
            backlog = asked  # a first day: the backlog alone
        assert not backlog & asked_before and len(backlog) <= BACKLOG_PER_DAY
        # Each asked symbol was sampled SAMPLES times this run, and nothing else was sent for tests.
        assert all(r.sampled == SAMPLES for r in rows), [(r.symbol, r.sampled) for r in rows]
        assert figures["asked_this_run"] == SAMPLES * len(rows)
        assert figures["candidates"] == len(rows) and figures["symbols"] == len(today)
        # The analysis works on the same units: the edited symbols and its own backlog slice, no more.
        assert backfill.metadata[index]["repo_analysis"]["asked_this_run"] <= len(EDITED.get(index, ())) + (
            BACKLOG_PER_DAY
        )
        asked_before |= asked


@SERVER_TIMEOUT
def test_the_backlog_advances_every_day(backfill: Backfill) -> None:
    asked_before: set[str] = set()
    remaining = []
    for index, day in enumerate(backfill.days()):
        today = {s.id for s in backfill.symbols(index)}
        asked = _ids(backfill.tests(day))
        edited = EDITED.get(index, set())
        never_asked = today - asked_before - edited  # what the backlog draws from today
        backlog = asked - edited
        # The day's budget is spent in full on symbols never asked, while there are any.
        assert backlog <= never_asked and len(backlog) == min(BACKLOG_PER_DAY, len(never_asked)), day
        remaining.append(len(never_asked - backlog))
        asked_before |= asked
    assert remaining[0] == len(backfill.symbols(0)) - BACKLOG_PER_DAY
    assert all(later < earlier for earlier, later in itertools.pairwise(remaining)), remaining
    # The bench's coverage figures agree: covered = symbols asked in their current form.
    figures = day_coverage(backfill.store, backfill.repo)
    per_day = [{s.id: s.memo_key for s in backfill.symbols(i)} for i in range(len(backfill.days()))]
    targeted = [_ids(backfill.tests(d)) for d in backfill.days()]
    assert [f.covered for f in figures] == covered_per_day(per_day, targeted)
    assert [f.covered for f in figures] == sorted(f.covered for f in figures) and figures[-1].covered > 0
    assert [f.symbols for f in figures] == [len(s) for s in per_day]
    assert all(f.too_large == [] for f in figures)


@SERVER_TIMEOUT
def test_every_accepted_test_passes_again_in_a_clean_checkout(backfill: Backfill) -> None:
    limits = backfill.settings.pipeline.cpu_assets.sandbox
    isolation = detect_isolation()
    # Whether any answer reaches the sandbox is the 135M model's luck (two samples of one symbol a day; a
    # fresh-clone run had none): the environment checks below hold every day, the re-runs for what was
    # accepted. The regression-oracle path itself is proven in jobs/test_oracle_tests.py on the sample.
    rerun = 0
    for release in backfill.repo.releases:
        # The environment the asset ran the tests in (built on the first day; the same hash every day).
        env = ensure_env(
            read_dependencies(dependency_files_at(backfill.repo.path, release.commit)), backfill.data_dir
        )
        assert env.ok and env.reused, env.reason
        for row in backfill.tests(release.day.isoformat()):
            assert row.verdict == "passed" or row.reason, row
            if not row.accepted:
                continue
            assert row.code and row.accepted_answers
            with open_sandbox(backfill.repo.path, release.commit, limits, isolation) as sandbox:
                sandbox.write(row.test_file, row.code)
                verdict = judge_test_file(sandbox, row.test_file, python=env.python)
            assert verdict.accepted, f"{release.version} {row.symbol}: {verdict.verdict}: {verdict.reason}"
            rerun += 1
    accepted = sum(m["generated_tests"]["accepted"] for m in backfill.metadata)
    assert rerun == accepted


@SERVER_TIMEOUT
def test_every_accepted_diff_applies_on_its_commit(backfill: Backfill, tmp_path: Path) -> None:
    judged = 0
    for release in backfill.repo.releases:
        for row in backfill.diffs(release.day.isoformat()):
            assert row.verdict == "accepted" or row.reason, row
            judged += row.verdict != "no_answer"  # an answer of the lane, read and ruled on by the judge
            if not row.accepted:
                continue
            assert row.diff
            checkout = Path(tempfile.mkdtemp(dir=tmp_path))
            export_commit(backfill.repo.path, release.commit, checkout)
            check = subprocess.run(
                ["git", "apply", "--check", "-"],
                input=row.diff,
                text=True,
                cwd=checkout,
                capture_output=True,
                env={"GIT_CEILING_DIRECTORIES": str(tmp_path), "PATH": "/usr/bin:/bin"},
            )
            assert check.returncode == 0, f"{release.version} {row.path}: {check.stderr}"
    reasons = [(r.path, r.verdict, r.reason[:200]) for d in backfill.days() for r in backfill.diffs(d)]
    assert judged > 0, f"no refactor answer for the package was judged on any day: {reasons}"


# --- the fixture and the benchmark's figures (no server) ----------------------------------------------------


def test_the_fixture_is_one_release_per_day_at_noon_utc(
    real_package_repo: ReleaseRepo,  # noqa: F811  (the fixture imported above)
) -> None:
    start = load_settings().pipeline.start_date
    limit = load_settings().pipeline.cpu_assets.max_file_bytes
    tree = {
        "LICENSE.txt",
        "setup.cfg",
        "setup.py",
        "src/decorator.py",
        "src/tests/__init__.py",
        "src/tests/documentation.py",
        "src/tests/test.py",
    }
    for index, release in enumerate(real_package_repo.releases):
        when = git(real_package_repo.path, "show", "-s", "--format=%aI %cI %s", release.commit).decode()
        day = (start + timedelta(days=index)).isoformat()
        assert when.split() == [
            f"{day}T12:00:00+00:00",
            f"{day}T12:00:00+00:00",
            "decorator",
            release.version,
        ]
        files = git(real_package_repo.path, "ls-tree", "-r", "--name-only", release.commit).decode().split()
        assert set(files) == tree  # no PKG-INFO, egg-info, changelog or docs
        module = git(real_package_repo.path, "show", f"{release.commit}:src/decorator.py").decode()
        assert f"__version__ = '{release.version}'" in module and len(module.encode()) > limit
    assert real_package_repo.days() == [(start + timedelta(days=i)).isoformat() for i in range(3)]


def test_a_release_that_cannot_be_downloaded_is_named(tmp_path: Path) -> None:
    with pytest.raises(RealPackageError, match=r"decorator==0\.0\.0\.dev9"):
        download_sdist("decorator", "0.0.0.dev9", tmp_path)


def test_kept_files_are_source_tests_dependency_files_and_the_licence() -> None:
    for path in (
        "src/decorator.py",
        "tests/test_x.py",
        "setup.cfg",
        "pyproject.toml",
        "requirements-dev.txt",
        "LICENSE.txt",
    ):
        assert kept(path), path
    for path in (
        "PKG-INFO",
        "src/decorator.egg-info/SOURCES.txt",
        "CHANGES.md",
        "docs/index.rst",
        "README.rst",
    ):
        assert not kept(path), path


def test_coverage_counts_a_symbol_only_in_the_form_it_was_asked() -> None:
    symbols = [
        {"m.py::f": "k1", "m.py::g": "k2"},
        {"m.py::f": "k1-edited", "m.py::g": "k2", "m.py::h": "k3"},
        {"m.py::f": "k1-edited", "m.py::g": "k2", "m.py::h": "k3"},
    ]
    targeted = [{"m.py::f"}, {"m.py::g"}, {"m.py::f", "m.py::h"}]
    assert covered_per_day(symbols, targeted) == [1, 1, 3]  # day 2: f's edit uncovers it until re-asked


def test_coverage_report_gives_the_files_left_out_and_the_first_fully_covered_day() -> None:
    days = [
        DayCoverage(day="2026-11-01", symbols=11, covered=5, too_large=["data.json"]),
        DayCoverage(day="2026-11-02", symbols=12, covered=12),
        DayCoverage(day="2026-11-03", symbols=12, covered=10, too_large=["data.json", "a.bin"]),
    ]
    out = coverage_report(days)
    assert out.left_out_for_size == ["a.bin", "data.json"]
    assert (out.days_to_full_coverage, out.full_coverage_on) == (2, "2026-11-02")
    partial = coverage_report(days[:1])
    assert (partial.days_to_full_coverage, partial.full_coverage_on, partial.left_out_for_size) == (
        None,
        None,
        ["data.json"],
    )
    assert (
        coverage_report([DayCoverage(day="2026-11-01", symbols=0, covered=0)]).days_to_full_coverage is None
    )
    assert coverage_report([]).days_to_full_coverage is None

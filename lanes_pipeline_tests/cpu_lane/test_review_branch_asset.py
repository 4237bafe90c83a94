"""The `review_branch` asset on prepared upstream partitions (no lane): the day's accepted work of each
repository becomes its branch lanes/<day>, the metadata gives the branch, the counts and the command to
read it, the tests pass at the tip (in the sandbox), a repository marked `review_branch: false` gets none,
a re-run changes nothing, `lanes export` writes the same work as patches, and a branch holding someone
else's commit fails the step with its name."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance, materialize

from lanes_pipeline.cli import main
from lanes_pipeline.cpu_lane.assets.repo_snapshot import repo_snapshot
from lanes_pipeline.cpu_lane.assets.review_branch import review_branch
from lanes_pipeline.cpu_lane.jobs.review import REFACTOR_CHECKS
from lanes_pipeline.daily.partitions import daily_partitions, partitioned_daily
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.settings import Settings, load_settings
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.config_files import read_config, write_config
from lanes_pipeline_tests.cpu_lane.review_fixtures import (
    DAY,
    accepted_doc,
    accepted_refactor,
    accepted_test,
    calc_repo,
    git_out,
    state_of,
)

BRANCH = f"lanes/{DAY}"


class Day:
    def __init__(self, root: Path, settings: Settings) -> None:
        self.root = root
        self.repo, self.off = root / "calc", root / "calc_off"
        self.base = calc_repo(self.repo)
        calc_repo(self.off)
        self.config_dir = root / "configs"
        shutil.copytree(settings.config_dir, self.config_dir)
        repos = [
            {"name": "calc", "path": str(self.repo)},
            {"name": "calc_off", "path": str(self.off), "review_branch": False},
        ]
        write_config(self.config_dir / "repos.yaml", {"repos": repos})
        pipeline = read_config(self.config_dir / "pipeline.yaml")
        pipeline["cpu_assets"]["sandbox"] = {"timeout_s": 60, "memory_mb": 1024, "runs": 1}
        write_config(self.config_dir / "pipeline.yaml", pipeline)
        self.data = root / "data"
        self.store = ArtifactStore(self.data / "artifacts")
        for repo in ("calc", "calc_off"):  # the day's accepted work of both, as the jobs wrote it
            self._add("generated_tests", accepted_test(repo))
            self._add("generated_docs", accepted_doc(repo))
            self._add("refactor_proposals", accepted_refactor(repo))
        self.instance = DagsterInstance.ephemeral()

    def _add(self, asset: str, row: Any) -> None:
        path = self.store.folder(asset, DAY) / "results.json"
        rows = json.loads(path.read_text()) if path.exists() else []
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([*rows, row.model_dump(mode="json")]))

    def run(self, asset: str) -> Any:
        resources = {
            "artifact_store": ArtifactStoreResource(root=str(self.store.root)),
            "pipeline_settings": PipelineSettingsResource(config_dir=str(self.config_dir)),
        }
        assets = partitioned_daily(
            [repo_snapshot, review_branch], daily_partitions(load_settings(self.config_dir))
        )  # type: ignore[arg-type]
        return materialize(
            assets,
            resources=resources,
            partition_key=DAY,
            instance=self.instance,
            selection=[asset],
            raise_on_error=False,
        )

    def metadata(self) -> dict[str, Any]:
        result = self.run("review_branch")
        assert result.success
        [event] = result.get_asset_materialization_events()
        return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.fixture
def day(tmp_path: Path, settings: Settings) -> Day:
    prepared = Day(tmp_path, settings)
    assert prepared.run("repo_snapshot").success
    return prepared


@pytest.mark.timeout(300)
def test_the_days_work_becomes_a_branch_whose_tests_pass_and_a_rerun_changes_nothing(day: Day) -> None:
    before = state_of(day.repo)
    first = day.metadata()
    command = f"git -C {day.repo} log -p {day.base[:12]}..{BRANCH}"
    assert (first["repos"], first["branches"], first["commits"], first["items_skipped"]) == (2, 1, 3, 0)
    assert first["tips_passing"] == 1 and first["review_commands"] == [command]
    tip = git_out(day.repo, "rev-parse", BRANCH).strip()
    assert len(git_out(day.repo, "log", "--format=%H", f"{day.base}..{BRANCH}").split()) == 3
    assert state_of(day.repo) == before
    branches = {b["repo"]: b for b in day.store.read_json("review_branch", DAY, "branches.json")}
    assert branches["calc"]["tests_at_tip"] == "passed (3 tests)" and branches["calc"]["tip"] == tip
    assert branches["calc_off"]["branch"] is None
    assert branches["calc_off"]["note"] == "review_branch: false in repos.yaml"
    assert subprocess.run(["git", "-C", str(day.off), "rev-parse", "-q", "--verify", BRANCH]).returncode != 0
    rows = day.store.read_json("review_branch", DAY, "results.json")
    assert [(r["kind"], r["status"]) for r in rows] == [
        ("test", "committed"),
        ("docstring", "committed"),
        ("refactor", "committed"),
    ]
    again = day.metadata()
    assert again["artifact_hash"] == first["artifact_hash"]
    assert git_out(day.repo, "rev-parse", BRANCH).strip() == tip

    patches = day.root / "patches"
    env = {"LANES_CONFIG_DIR": str(day.config_dir), "LANES_DATA_DIR": str(day.data)}
    # Each item says what it was checked for: in its row, its commit message and `lanes report --day`.
    test_checks, doc_checks, refactor_checks = (r.get("checks", []) for r in rows)
    assert test_checks[:2] == ["policy", "passes at the commit"] and "fails on return_none" in test_checks
    assert refactor_checks == list(REFACTOR_CHECKS)
    log = git_out(day.repo, "log", "--format=%B", f"{day.base}..{BRANCH}")
    assert f"Checks passed: {', '.join(test_checks)}" in log
    assert f"Checks passed: {', '.join(refactor_checks)}" in log
    reported = CliRunner().invoke(main, ["report", "--day", DAY], env=env)
    assert reported.exit_code == 0, reported.output
    assert "## The review branch: 3 item(s)" in reported.output and "No evaluation:" in reported.output
    assert ", ".join(test_checks) in reported.output and ", ".join(refactor_checks) in reported.output
    assert ", ".join(doc_checks) in reported.output and "doctest_passes" in doc_checks
    exported = CliRunner().invoke(main, ["export", "--day", DAY, "--patches", str(patches)], env=env)
    assert exported.exit_code == 0, exported.output
    assert f"calc: 3 patch(es) of {BRANCH} in {patches / 'calc'}" in exported.output
    assert "calc_off: no review branch for 2026-11-01 (review_branch: false in repos.yaml)" in exported.output
    series = sorted((patches / "calc").glob("*.patch"))
    clone = day.root / "clone"
    subprocess.run(["git", "clone", "-q", str(day.repo), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "switch", "-q", "--detach", day.base], check=True)
    author = ["-c", "user.name=R", "-c", "user.email=r@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "-C", str(clone), *author, "am", "-q", *map(str, series)], check=True)
    assert git_out(clone, "rev-parse", "HEAD^{tree}") == git_out(day.repo, "rev-parse", f"{BRANCH}^{{tree}}")
    # The default folder, one repository, and the errors that name what is wrong.
    only = CliRunner().invoke(main, ["export", "--day", DAY, "--repo", "calc"], env=env)
    assert only.exit_code == 0 and str(day.data / "review" / DAY / "calc") in only.output, only.output
    unknown = CliRunner().invoke(main, ["export", "--day", DAY, "--repo", "nope"], env=env)
    assert (
        unknown.exit_code != 0
        and "--repo nope: no such repository in repos.yaml (calc, calc_off)" in unknown.output
    )
    missing = CliRunner().invoke(main, ["export", "--day", "2026-11-02"], env=env)
    assert missing.exit_code != 0 and "review_branch has no partition 2026-11-02" in missing.output
    not_a_day = CliRunner().invoke(main, ["export", "--day", "../../etc"], env=env)
    assert not_a_day.exit_code == 2 and "'../../etc' does not match the format '%Y-%m-%d'" in not_a_day.output


def test_a_branch_holding_someone_elses_commit_fails_the_step_and_is_left_as_it_is(day: Day) -> None:
    git = ["git", "-C", str(day.repo), "-c", "user.name=U", "-c", "user.email=u@example.com"]
    subprocess.run([*git, "branch", BRANCH, day.base], check=True)
    subprocess.run([*git, "switch", "-q", BRANCH], check=True)
    subprocess.run(
        [*git, "-c", "commit.gpgsign=false", "commit", "-q", "--allow-empty", "-m", "mine"], check=True
    )
    subprocess.run([*git, "switch", "-q", "main"], check=True)
    tip = git_out(day.repo, "rev-parse", BRANCH)
    result = day.run("review_branch")
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = str(failure.step_failure_data.error)
    assert f"calc: the branch {BRANCH} in {day.repo} holds commits lanes_pipeline did not write" in message
    assert git_out(day.repo, "rev-parse", BRANCH) == tip

"""`lanes status` answers with the lanes down and with them up. Down: nothing listens on the ports the
configs give, and a data folder built here holds an adapter registry whose alias moved, a day of
generated_tests' coverage and a Dagster instance with a `daily_lanes` run whose assets recorded the day;
the status names each lane and why it is down, exits 3, and says the same as JSON. Up: the session's real
servers, their models and slots. Also the parts that are pure: the next run's time, and the exit code."""

from __future__ import annotations

import json
import shutil
import socket
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from dagster import (
    AssetSelection,
    DagsterInstance,
    DailyPartitionsDefinition,
    Definitions,
    MaterializeResult,
    asset,
    define_asset_job,
)

from lanes_pipeline.cli import main
from lanes_pipeline.cli.status_view import (
    LANE_DOWN_EXIT,
    Status,
    alias_of,
    lane_down,
    lane_up,
    last_day,
    next_daily_run,
    render,
)
from lanes_pipeline.cpu_lane.jobs.tests_day import COVERAGE_FILE, COVERAGE_FOLDER, SymbolTestCoverage
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry, AliasMove, Version
from lanes_pipeline.gpu_lane.learning_report import LEARNING_ASSET, LEARNING_FILE
from lanes_pipeline.gpu_lane.promotion import LearningPoint
from lanes_pipeline.http import ModelList
from lanes_pipeline.metrics.prometheus import LaneCounters
from lanes_pipeline.settings import project_root
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.config_files import read_config, write_config

DAY = "2026-11-02"
VERSION = f"lanes-{DAY}"
ALIAS = "lanes-current"


def free_port() -> int:
    """A port nothing listens on (bound and released at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Project:
    config_dir: Path
    data_dir: Path
    dagster_home: Path
    cpu_url: str
    gpu_url: str


def project(
    root: Path, monkeypatch: pytest.MonkeyPatch, cpu_url: str | None = None, gpu_url: str | None = None
) -> Project:
    """The shipped configs, but for the lanes: external URLs when given, else embedded on free ports."""
    config_dir, data, home = root / "configs", root / "data", root / "dagster_home"
    for folder in (config_dir, data):
        folder.mkdir(parents=True)
    for shipped in (project_root() / "configs").glob("*.yaml"):
        shutil.copy(shipped, config_dir / shipped.name)
    lanes = read_config(project_root() / "configs" / "lanes.yaml")
    urls = {}
    for lane, given in (("cpu_lane", cpu_url), ("gpu_lane", gpu_url)):
        if given is None:
            port = free_port()
            lanes[lane]["embedded"]["port"] = port
            urls[lane] = f"http://127.0.0.1:{port}"
        else:
            lanes[lane]["base_url"] = urls[lane] = given
    write_config(config_dir / "lanes.yaml", lanes)
    for name, value in {"LANES_CONFIG_DIR": config_dir, "LANES_DATA_DIR": data, "DAGSTER_HOME": home}.items():
        monkeypatch.setenv(name, str(value))
    return Project(config_dir, data, home, urls["cpu_lane"], urls["gpu_lane"])


def promote_a_version(data: Path) -> None:
    """The registry as served_adapter leaves it: a version judged, promoted, the alias moved to it."""
    registry = AdapterRegistry(data / "adapters" / "registry.sqlite")
    registry.add(VERSION, date.fromisoformat(DAY), data / "adapters" / VERSION, "f" * 16, {})
    figures = {
        "eval_loss": 1.25,
        "repo_pass_rate": 0.5,
        "humaneval_pass1": 0.1,
        "completion_edit_similarity": 0.41,
    }
    registry.record_evaluation(VERSION, {"figures": {"candidate": figures}})
    registry.record_move(ALIAS, VERSION, "promoted on its day's evaluation", {VERSION: "promoted"})


IMPORT_PROBLEM = "`import gen` fails in the sandbox: ModuleNotFoundError: No module named 'gen._version'"


def record_coverage(data: Path) -> None:
    """Two days of generated_tests' coverage: the newest is the one to show."""
    store = ArtifactStore(data / "artifacts")
    for day, covered in (("2026-11-01", 4), (DAY, 12)):
        row = SymbolTestCoverage(
            repo="sample",
            symbols=30,
            covered=covered,
            with_accepted_test=5,
            changed_today=3,
            backlog_today=9,
            remaining=30 - covered,
            import_problems={"gen": IMPORT_PROBLEM} if day == DAY else {},
        )
        store.write_json(COVERAGE_FOLDER, day, COVERAGE_FILE, [row.model_dump(mode="json")])


def record_a_day(day: str) -> str:
    """A `daily_lanes` run on the instance at $DAGSTER_HOME whose day's assets record what the real ones
    do (the names and metadata keys `lanes status` reads); returns the run id."""
    partitions = DailyPartitionsDefinition(start_date="2026-11-01")
    recorded: dict[str, dict[str, Any]] = {
        "accepted_work": {
            "candidates": 7,
            "candidates_write_tests": 4,
            "candidates_write_docs": 3,
            "candidates_explain": 0,
        },
        "lora_dataset": {"dagster/row_count": 42, "train_rows": 30, "eval_rows": 12},
        "lora_adapter": {"version": VERSION},
        "adapter_evaluation": {"promote": True, "candidate": VERSION},
    }

    def recording(name: str, metadata: dict[str, Any]) -> Any:
        @asset(name=name, partitions_def=partitions)
        def the_asset() -> MaterializeResult:
            return MaterializeResult(metadata=metadata)

        return the_asset

    defs = Definitions(
        assets=[recording(name, metadata) for name, metadata in recorded.items()],
        jobs=[define_asset_job("daily_lanes", selection=AssetSelection.all())],
    )
    with DagsterInstance.get() as instance:
        result = defs.resolve_job_def("daily_lanes").execute_in_process(instance=instance, partition_key=day)
    assert result.success
    return result.run_id


def test_with_the_lanes_down_the_status_says_so_and_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = project(tmp_path, monkeypatch)
    promote_a_version(where.data_dir)
    record_coverage(where.data_dir)
    where.dagster_home.mkdir()
    shutil.copy(project_root() / "dagster.yaml", where.dagster_home / "dagster.yaml")
    run_id = record_a_day(DAY)

    shown = CliRunner().invoke(main, ["status"])
    assert shown.exit_code == LANE_DOWN_EXIT, shown.output
    text = shown.stdout
    assert f"CPU lane  DOWN  {where.cpu_url}\n      CPU lane at {where.cpu_url} is unreachable" in text
    assert f"GPU lane  DOWN  {where.gpu_url}\n      GPU lane at {where.gpu_url} is unreachable" in text
    assert f"Alias {ALIAS} " in text
    assert (
        f"serves {VERSION} (trained for {DAY}) since " in text
        and "(promoted on its day's evaluation)" in text
    )
    assert "completion edit similarity 0.410, repository tasks 50%, HumanEval 10%, eval loss 1.250" in text
    assert "loaded in vLLM: unknown (the GPU lane is down)" in text
    assert f"Last day {DAY}: success (run {run_id[:8]}, ended " in text
    assert "accepted work: 7 (3 write_docs, 4 write_tests)" in text
    assert f"dataset 42 rows; adapter {VERSION}; decision promote" in text
    assert "review branch: none" in text
    assert "(daily_lanes_schedule, cron '0 4 * * *';" in text
    assert "Coverage by generated tests, as of 2026-11-02" in text
    assert (
        "sample  12 of 30 symbols covered (40%), 5 with an accepted test, 18 waiting in the backlog" in text
    )
    assert f"        1 module(s) not asked: {IMPORT_PROBLEM}" in text  # why part of the day stayed empty
    assert f"The CPU and GPU lanes are down (exit code {LANE_DOWN_EXIT})" in text

    as_json = CliRunner().invoke(main, ["status", "--json"])
    assert as_json.exit_code == LANE_DOWN_EXIT, as_json.output
    status = Status.model_validate_json(as_json.stdout)
    assert [(lane.lane, lane.url, lane.up) for lane in status.lanes] == [
        ("cpu", where.cpu_url, False),
        ("gpu", where.gpu_url, False),
    ]
    assert status.alias.version == VERSION and status.alias.figures["repo_pass_rate"] == 0.5
    assert status.last_day is not None and status.last_day.run_id == run_id
    assert status.last_day.accepted == {"write_docs": 3, "write_tests": 4} and status.last_day.branch is None
    assert status.next_run is not None and status.next_run.cron == "0 4 * * *" and status.next_run.enabled
    assert [c.covered for c in status.coverage] == [12] and status.coverage_day == DAY
    assert status.problems == []


def test_a_fresh_data_folder_shows_nothing_yet_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = project(tmp_path, monkeypatch)
    shown = CliRunner().invoke(main, ["status"])
    assert shown.exit_code == LANE_DOWN_EXIT, shown.output
    assert "serves no adapter yet" in shown.stdout
    assert "Last day: no daily_lanes run recorded" in shown.stdout
    assert "Coverage: no day has recorded generated_tests' coverage yet" in shown.stdout
    assert list(where.data_dir.iterdir()) == [] and not where.dagster_home.exists()


def test_with_the_lanes_up_the_status_shows_their_models_and_slots(
    cpu_server: EmbeddedServer, gpu_server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project(tmp_path, monkeypatch, cpu_url=cpu_server.url, gpu_url=gpu_server.url)
    shown = CliRunner().invoke(main, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    status = Status.model_validate_json(shown.stdout)
    cpu, gpu = status.lanes
    assert cpu.up and cpu.url == cpu_server.url and cpu.models == ["smollm2"]
    assert cpu.slots_total == 2 and cpu.slots_busy == 0 and cpu.requests_waiting == 0
    assert gpu.up and gpu.url == gpu_server.url and "smollm2-hf" in gpu.models
    assert gpu.slots_busy == 0 and gpu.requests_waiting == 0
    assert status.alias.loaded is not None  # vLLM answered: whether it lists the alias is known
    text = CliRunner().invoke(main, ["status"]).stdout
    assert f"CPU lane  up    {cpu_server.url}  smollm2  slots busy 0/2, waiting 0" in text


@pytest.mark.parametrize(
    ("now", "at", "for_day"),
    [
        (datetime(2026, 11, 21, 3, 59, tzinfo=UTC), datetime(2026, 11, 21, 4, 0, tzinfo=UTC), "2026-11-20"),
        (datetime(2026, 11, 21, 4, 0, tzinfo=UTC), datetime(2026, 11, 22, 4, 0, tzinfo=UTC), "2026-11-21"),
        (datetime(2026, 12, 31, 23, 0, tzinfo=UTC), datetime(2027, 1, 1, 4, 0, tzinfo=UTC), "2026-12-31"),
    ],
)
def test_the_next_run_is_the_next_tick_for_the_day_before_it(
    now: datetime, at: datetime, for_day: str
) -> None:
    tick, day = next_daily_run("0 4 * * *", "UTC", now)
    assert tick == at and day.isoformat() == for_day


def test_the_next_run_keeps_its_wall_clock_time_across_a_clock_change() -> None:
    # Berlin leaves summer time on 2026-10-25: 04:30 local is 02:30 UTC before, 03:30 UTC after.
    tick, day = next_daily_run("30 4 * * *", "Europe/Berlin", datetime(2026, 10, 25, 1, 0, tzinfo=UTC))
    assert (tick.hour, tick.minute) == (4, 30) and tick.astimezone(UTC).hour == 3
    assert day == date(2026, 10, 24)
    with pytest.raises(ValueError, match="not a daily schedule"):
        next_daily_run("0 4 * * 1", "UTC", datetime(2026, 11, 21, tzinfo=UTC))


def test_the_last_day_reads_each_assets_figures_and_a_quiet_day_says_why() -> None:
    quiet = last_day(
        DAY,
        "r" * 32,
        "success",
        None,
        {
            "adapter_evaluation": {"no_adapter": "no training rows in the window", "promote": False},
            "review_branch": {"branches": 1, "commits": 2},
        },
    )
    assert quiet.decision == "no adapter: no training rows in the window"
    assert quiet.branch == f"lanes/{DAY}" and quiet.dataset_rows is None and quiet.accepted == {}
    rejected = last_day(DAY, "r" * 32, "failure", None, {"adapter_evaluation": {"promote": False}})
    assert rejected.decision == "reject" and rejected.outcome == "failure"


def _status(cpu_up: bool, loaded_from: str | None) -> Status:
    """A status as `gather` builds it, with the CPU lane up or down and the GPU lane up, its /v1/models
    listing the alias loaded from `loaded_from` (None: not loaded)."""
    cards = [{"id": "smollm2-hf"}]
    if loaded_from is not None:
        cards.append({"id": ALIAS, "root": f"/data/adapters/{loaded_from}", "parent": "smollm2-hf"})
    models = ModelList.model_validate({"data": cards})
    counters = LaneCounters(
        engine="vllm",
        prompt_tokens_total=0,
        generation_tokens_total=0,
        requests_running=1,
        requests_waiting=2,
    )
    cpu = (
        lane_up("cpu", "http://127.0.0.1:8081", ModelList(data=[]), None, 2)
        if cpu_up
        else lane_down("cpu", "http://127.0.0.1:8081", "CPU lane at ... is unreachable")
    )
    move = AliasMove(
        alias=ALIAS, version=VERSION, moved_at="2026-11-03T04:31:00.000+00:00", reason="promoted"
    )
    target = Version(
        name=VERSION,
        day=date.fromisoformat(DAY),
        path="/x",
        status="promoted",
        fingerprint="f",
        created_at="2026-11-03T04:00:00+00:00",
    )
    return Status(
        checked_at=datetime(2026, 11, 3, 9, 0, tzinfo=UTC),
        lanes=[cpu, lane_up("gpu", "http://127.0.0.1:8000", models, counters, None)],
        alias=alias_of(ALIAS, [move], target, models),
        last_day=None,
        next_run=None,
        coverage_day=None,
        coverage=[],
        problems=[],
    )


def test_the_text_says_which_lane_is_down_and_where_the_alias_is_loaded_from() -> None:
    up = _status(cpu_up=True, loaded_from=VERSION)
    assert up.exit_code() == 0
    text = render(up)
    assert "GPU lane  up    http://127.0.0.1:8000  smollm2-hf, lanes-current  slots busy 1, waiting 2" in text
    assert "CPU lane  up    http://127.0.0.1:8081  -  slots busy -/2, waiting -" in text
    assert f"serves {VERSION} (trained for {DAY}) since 2026-11-03 04:31 UTC (promoted)" in text
    assert "loaded in vLLM: yes" in text and "down" not in text
    stale = _status(cpu_up=False, loaded_from="lanes-2026-11-01")
    assert stale.exit_code() == LANE_DOWN_EXIT
    text = render(stale)
    assert f"loaded in vLLM: from lanes-2026-11-01, not {VERSION} (`lanes adapters restore`)" in text
    assert "The CPU lane is down (exit code 3)" in text
    assert "loaded in vLLM: no (`lanes adapters restore` loads it again)" in render(_status(True, None))


def test_every_command_takes_h_and_the_top_level_help_lists_the_exit_codes() -> None:
    runner = CliRunner()

    def commands(group: Any, path: list[str]) -> list[list[str]]:
        found = [path]
        for name, command in getattr(group, "commands", {}).items():
            found += commands(command, [*path, name])
        return found

    every = commands(main, [])
    assert ["status"] in every and ["adapters", "list"] in every
    for path in every:
        short, long = runner.invoke(main, [*path, "-h"]), runner.invoke(main, [*path, "--help"])
        assert short.exit_code == 0 and short.output == long.output, (path, short.output)
        assert short.output.startswith("Usage: ")
    top = runner.invoke(main, ["-h"]).output
    assert "Exit codes:" in top and f"  {LANE_DOWN_EXIT}    `lanes status`: a lane is down" in top
    assert "130  stopped by Ctrl-C" in top
    version = runner.invoke(main, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("lanes, version ")


def test_adapters_list_json_gives_every_version_and_the_alias(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = project(tmp_path, monkeypatch)
    promote_a_version(where.data_dir)
    shown = CliRunner().invoke(main, ["adapters", "list", "--json"])
    assert shown.exit_code == 0, shown.output
    listing = json.loads(shown.stdout)
    assert listing["alias"] == ALIAS and listing["alias_target"] == VERSION
    [version] = listing["versions"]
    assert version["name"] == VERSION and version["status"] == "promoted"
    assert version["evaluation"]["figures"]["candidate"]["eval_loss"] == 1.25


def test_report_json_gives_the_curve_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = project(tmp_path, monkeypatch)
    empty = CliRunner().invoke(main, ["report", "--json"])
    assert empty.exit_code == 0 and json.loads(empty.stdout) == {"points": []}
    point = LearningPoint(day=date.fromisoformat(DAY), served=VERSION, candidate=VERSION, promoted=True)
    ArtifactStore(where.data_dir / "artifacts").write_json(
        LEARNING_ASSET, DAY, LEARNING_FILE, point.model_dump(mode="json")
    )
    curve = CliRunner().invoke(main, ["report", "--json"])
    assert curve.exit_code == 0, curve.output
    [shown] = json.loads(curve.stdout)["points"]
    assert LearningPoint.model_validate(shown) == point
    assert not (where.data_dir / "reports").exists()  # JSON only: no file written
    missing = CliRunner().invoke(main, ["report", "--day", DAY, "--json"])
    assert missing.exit_code == 1 and "answers.json does not exist" in missing.output

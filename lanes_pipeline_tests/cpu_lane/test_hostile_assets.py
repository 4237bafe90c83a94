"""Hostile answers through the real CPU-lane assets on the real server (issue 14 item 6).

The embedded llama-server (the session's `cpu_server`) answers every request of one day of the assets with
an entry of the hostile corpus (hostile_corpus.py: at least 100 answers), made exact by a grammar that
matches only that text (hostile_lane.py). The day runs on the sample repository's day 1 (15 symbols: one
analysis and one refactor each, and of tests and docstrings three samples each for the whole corpus, 120
requests, or one each for the fast tier's part, 60: every kind of attack in some stage, every analysis and
diff, `hostile_corpus.FAST_PART`). Then:

- `escaped` counts hostile effects seen outside the sandbox: a canary file written on the host (under
  /tmp, /root, /etc or beside a sandbox), the victim file deleted or changed, the planted secret's token in
  any artifact or run metadata, a connection to the listener on 127.0.0.1:47811, the repository changed;
- `reached_dataset` counts entries whose text or hostile payload (`markers`) is in a LoRA dataset row;
- `crashed_runs` counts runs that failed (a hostile answer must cost an item, never the run).

All three must be 0, every entry must have been sent and come back exactly, and no request may have gone
unmatched. The positive control: each stage's one harmless answer (the corpus' `control` entries) must be
accepted and reach the dataset, so an empty dataset cannot pass for a safe one. The model emits only what
the grammar forces, so the day takes the time of its short answers and the sandbox runs of what parsed
(about 120 s for the fast part and 175 s for the whole on two cores).

The day's review branch (review_branch, committed into the repository) must hold no entry's text or payload
either, and the committed stages' controls (test, docstring, diff) must be on it.
"""

from __future__ import annotations

import glob
import secrets
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest
from dagster import DagsterInstance, load_assets_from_modules, materialize

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.checks import build_checks
from lanes_pipeline.daily.partitions import daily_partitions, partitioned_daily
from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.dataset.checks import build_dataset_checks
from lanes_pipeline.definitions import CPU_DAY_MODULES
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.git import build_history
from lanes_pipeline.settings import CpuLane, Settings, load_settings
from lanes_pipeline_tests.config_files import read_config, write_config
from lanes_pipeline_tests.cpu_lane.hostile_corpus import (
    CANARY_PREFIX,
    FAST_PART,
    HOME_CANARY,
    LISTEN_PORT,
    SECRET_FILE,
    VICTIM,
    Stage,
    corpus,
    fast_part,
)
from lanes_pipeline_tests.cpu_lane.hostile_lane import HostileCpuLane, HostileDeliveries

# Minutes on two idle cores; under a heavy load (other servers, builds) the answers alone took 20.
pytestmark = pytest.mark.timeout(3600)

DAY = "2026-11-01"
# The corpus' parts, with the samples per symbol that give each entry one request of its stage.
PARTS = {"fast": (fast_part, 1), "whole": (corpus, 3)}
# Where hostile code aims its writes; none may exist after the run (besides the /tmp prefix).
OTHER_CANARIES = (HOME_CANARY, "/etc/lanes_hostile_canary")


class Listener:
    """Counts connections to 127.0.0.1:LISTEN_PORT while the day runs (the sandbox has no network)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", LISTEN_PORT))
        self.server.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.server.close()


def _canaries(root: Path) -> list[str]:
    found = glob.glob(f"{CANARY_PREFIX}*") + [p for p in OTHER_CANARIES if Path(p).exists()]
    found += glob.glob("/tmp/*/lanes_hostile_canary*") + glob.glob("/tmp/*/*/lanes_hostile_canary*")
    return sorted(set(found + [str(p) for p in root.rglob("lanes_hostile_canary*")]))


def _clear_canaries(root: Path) -> None:
    for path in _canaries(root):
        Path(path).unlink()


@dataclass
class HostileDay:
    part: str  # of the corpus: PARTS
    deliveries: HostileDeliveries
    success: bool
    failed_steps: list[str]
    checks: dict[str, bool]
    rows: list[str]
    accepted: str = ""  # accepted_work's partition as written: what the CPU lane handed the dataset
    branch_log: str = ""  # `git log -p` of the day's review branch: what reached the repository
    escaped: list[str] = field(default_factory=list)
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)


def _configure(root: Path, settings: Settings, samples_per_item: int) -> tuple[Path, Path]:
    repo = root / "repo"
    build_history(repo, sample_repo.history()[:1])
    config_dir = root / "configs"
    shutil.copytree(settings.config_dir, config_dir)
    repos = {
        "repos": [
            {
                "name": "sample",
                "path": str(repo),
                "include": ["**/*.py"],
                "exclude": ["**/__init__.py", "tests/**"],
            }
        ]
    }
    write_config(config_dir / "repos.yaml", repos)
    pipeline = read_config(config_dir / "pipeline.yaml")
    pipeline["cpu_assets"].update(
        backlog_per_day=15,  # the whole of day 1: every symbol, in every stage
        samples_per_item=samples_per_item,
        analysis_max_tokens=480,  # room for the longest entry of each stage (tokens <= characters)
        tests_max_tokens=480,
        refactor_max_tokens=480,
        # The corpus has no stage of function bodies (its texts are not written for a named function, so
        # every one would end as no_def): verified_bodies asks nothing here. A body runs in the same
        # sandbox as the GPU lane's repository tasks (dataset/body_check.py).
        body_samples=0,
        sandbox={"timeout_s": 10, "memory_mb": 1024, "runs": 1},
    )
    write_config(config_dir / "pipeline.yaml", pipeline)
    return repo, config_dir


@pytest.fixture(scope="module", params=["fast", pytest.param("whole", marks=pytest.mark.slow)])
def hostile_day(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    settings: Settings,
    cpu_server: EmbeddedServer,
) -> Iterator[HostileDay]:
    """The day of the fast tier's part of the corpus, or (slow tier) of the whole corpus."""
    entries, samples_per_item = PARTS[request.param]
    root = tmp_path_factory.mktemp(f"hostile_{request.param}")
    repo, config_dir = _configure(root, settings, samples_per_item)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout
    _clear_canaries(root)
    token = f"lanes-hostile-secret-{secrets.token_hex(12)}"
    Path(SECRET_FILE).write_text(token + "\n")
    Path(VICTIM).write_text("victim\n")
    deliveries = HostileDeliveries(entries=entries())
    session = f"hostile-{secrets.token_hex(4)}"
    HostileCpuLane.sessions[session] = deliveries
    store_root = root / "artifacts"
    resources = {
        "cpu_lane": HostileCpuLane(
            config=CpuLane(base_url=cpu_server.url, cache_path=str(root / "cache.sqlite3")),
            hostile_session=session,
        ),
        "artifact_store": ArtifactStoreResource(root=str(store_root)),
        "pipeline_settings": PipelineSettingsResource(config_dir=str(config_dir)),
        "lora_training": LoraTrainingResource.from_config(load_settings(config_dir).training),
    }
    partitions = daily_partitions(load_settings(config_dir))
    assets = partitioned_daily(
        load_assets_from_modules(CPU_DAY_MODULES),
        partitions,  # type: ignore[arg-type]
    )
    listener = Listener()
    try:
        result = materialize(
            [*assets, *build_checks(partitions), *build_dataset_checks(partitions)],
            resources=resources,
            partition_key=DAY,
            instance=DagsterInstance.ephemeral(),
            raise_on_error=False,
        )
    finally:
        listener.close()
        HostileCpuLane.sessions.pop(session, None)
    failed = [e.step_key or "" for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    metadata = {
        e.asset_key.to_user_string(): {k: v.value for k, v in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
    }
    day = HostileDay(
        part=request.param,
        deliveries=deliveries,
        success=result.success,
        failed_steps=failed,
        checks={c.check_name: c.passed for c in result.get_asset_check_evaluations()},
        rows=_dataset_rows(store_root / "lora_dataset" / DAY),
        accepted=_read_or_empty(store_root / "accepted_work" / DAY / "accepted.json"),
        metadata=metadata,
    )
    day.branch_log = subprocess.run(
        ["git", "log", "-p", f"{head.strip()}..lanes/{DAY}", "--"], cwd=repo, capture_output=True, text=True
    ).stdout
    day.escaped = [f"canary {p}" for p in _canaries(root)]
    if not Path(VICTIM).exists() or Path(VICTIM).read_text() != "victim\n":
        day.escaped.append(f"victim {VICTIM} deleted or changed")
    day.escaped += [f"secret token in {p}" for p in _files_holding(root, token.encode())]
    if token in repr(metadata) or token in repr([e.event_specific_data for e in result.all_events]):
        day.escaped.append("secret token in the run's events")
    if listener.connections:
        day.escaped.append(f"{listener.connections} connection(s) to 127.0.0.1:{LISTEN_PORT}")
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    after = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout
    if status.strip() or after != head:
        day.escaped.append(f"repository changed: {status.strip()[:200]} {after.strip()}")
    try:
        yield day
    finally:
        _clear_canaries(root)
        for path in (SECRET_FILE, VICTIM):
            Path(path).unlink(missing_ok=True)


def _dataset_rows(folder: Path) -> list[str]:
    from datasets import load_from_disk

    data = load_from_disk(str(folder))
    return ["\n".join(m["content"] for m in row["messages"]) for split in data.values() for row in split]


def _read_or_empty(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes())


def test_the_corpus_went_through_the_real_server_exactly(hostile_day: HostileDay) -> None:
    deliveries = hostile_day.deliveries
    names = {e.name for e in deliveries.entries}
    if hostile_day.part == "whole":
        assert len(names) >= 100
    else:
        assert names == FAST_PART
    assert deliveries.unmatched == []
    assert names - deliveries.delivered() == set()  # every entry was the answer to some request
    wrong = [(d.entry, d.request_id, d.finish_reason) for d in deliveries.deliveries if not d.exact]
    assert wrong == []  # the server answered each with exactly its text (up to the request's stop strings)


def test_no_hostile_answer_escaped_reached_the_dataset_or_crashed_a_run(hostile_day: HostileDay) -> None:
    delivered = hostile_day.deliveries.delivered()
    entries = [e for e in hostile_day.deliveries.entries if e.name in delivered and not e.control]
    reached = sorted(
        e.name
        for e in entries
        if any(e.text in row or any(m in row for m in e.markers) for row in hostile_day.rows)
    )
    crashed_runs = 0 if hostile_day.success else 1
    counts = {
        "escaped": len(hostile_day.escaped),
        "reached_dataset": len(reached),
        "crashed_runs": crashed_runs,
    }
    assert counts == {"escaped": 0, "reached_dataset": 0, "crashed_runs": 0}, (
        hostile_day.escaped,
        reached,
        hostile_day.failed_steps,
    )
    assert hostile_day.checks["lora_dataset_has_no_secrets"] is True


def test_each_stage_judged_every_hostile_answer_with_a_reason(hostile_day: HostileDay) -> None:
    md = hostile_day.metadata
    assert md["repo_analysis"]["items"] == 15
    assert md["generated_tests"]["candidates"] == 15
    assert md["refactor_proposals"]["proposals"] == 15
    # Nothing hostile is accepted as a refactor or a docstring, only each stage's harmless control.
    assert md["refactor_proposals"]["accepted"] == 1
    assert md["generated_docs"]["accepted"] == 1


def test_each_stages_harmless_control_reached_the_dataset(hostile_day: HostileDay) -> None:
    controls = [e for e in hostile_day.deliveries.entries if e.control]
    assert {c.stage for c in controls} == set(get_args(Stage))
    delivered = hostile_day.deliveries.delivered()
    assert {c.name for c in controls} <= delivered
    # Every control is accepted; an explanation is handed on to the dataset only while the analysis checks
    # are precise enough on the labelled real analyses (analysis_checks.MIN_PRECISION), else accepted_work
    # leaves it out and counts it.
    gate = hostile_day.metadata["accepted_work"]["analysis_gate"]
    handed = [c for c in controls if c.stage != "analysis" or gate["explanations_trained"]]
    not_handed = [m for c in handed for m in c.markers if m not in hostile_day.accepted]
    assert not_handed == [], not_handed
    missing = {
        c.name: [m for m in c.markers if not any(m in row for row in hostile_day.rows)] for c in handed
    }
    assert {name: lost for name, lost in missing.items() if lost} == {}, len(hostile_day.rows)
    if not gate["explanations_trained"]:
        assert not any("lanes control analysis" in row for row in hostile_day.rows)
        assert hostile_day.metadata["accepted_work"]["explanations_left_out"] >= 1  # the control, accepted


def test_no_hostile_answer_reached_the_review_branch_and_each_committed_control_did(
    hostile_day: HostileDay,
) -> None:
    delivered = hostile_day.deliveries.delivered()
    entries = [e for e in hostile_day.deliveries.entries if e.name in delivered]
    log = hostile_day.branch_log
    reached = sorted(
        e.name for e in entries if not e.control and (e.text in log or any(m in log for m in e.markers))
    )
    assert reached == []
    controls = [e for e in entries if e.control and e.stage in ("test", "docstring", "diff")]
    assert len(controls) == 3
    assert [c.name for c in controls if not all(m in log for m in c.markers)] == []
    assert hostile_day.metadata["review_branch"]["commits"] >= len(controls)

"""`launcher: accelerate` on this machine: two trainer processes on the CPU (gloo) under `accelerate launch`,
on real PEFT + SmolLM2. They take the same steps as one process (same seed: the same loss curve and, up to
float rounding, the same adapter); only the main one reports through Dagster Pipes and writes the adapter;
stopped, the launcher leaves no process and no visible adapter; and the real vLLM serves what they trained."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import psutil
import pytest
from dagster import DagsterInstance, MaterializeResult, asset, materialize

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.gpu_lane.adapters import check_adapter_dir, supported_target_modules
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.training.runner import run_training, start_trainer, stop
from lanes_pipeline.gpu_lane.training.spec import TRAINING_SUMMARY, TrainSpec, TrainSummary
from lanes_pipeline.http import ChatMessage, ChatRequest
from lanes_pipeline.settings import LoraSettings, Settings, TrainingConfig
from lanes_pipeline_tests.gpu_lane.fixtures import CODENAME, PROBE_QUESTION, SYSTEM, write_codename_day

# Multi-process training (accelerate) proves no promise of the daily loop: the slow tier.
pytestmark = pytest.mark.slow

DAY = date(2026, 11, 5)
# What test_gpu_pipeline teaches the codename with (8 steps at 2e-3, no dropout), on the CPU.
CODENAME_TRAINING = TrainingConfig(
    max_steps=8, learning_rate=2e-3, lora=LoraSettings(dropout=0.0), device="cpu", seed=0
)


@dataclass
class Runs:
    base_model_dir: Path
    single: TrainSummary
    single_dir: Path
    two: TrainSummary
    two_dir: Path
    run_log: list[str]


def _spec(settings: Settings, root: Path, name: str, training: TrainingConfig) -> TrainSpec:
    return TrainSpec(
        training=training,
        base_model_dir=str(engines.embedded_hf_model(settings.data_dir).resolve()),
        dataset_dirs=[str(write_codename_day(root / name / "artifacts", DAY))],
        output_dir=str(root / name / "adapters" / f"lanes-{DAY}"),
    )


@pytest.fixture(scope="module")
def runs(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The same training in one process (outside Dagster) and in two (from an asset, through Pipes)."""
    root = tmp_path_factory.mktemp("processes")
    single_spec = _spec(settings, root, "single", CODENAME_TRAINING)
    two_spec = _spec(
        settings, root, "two", CODENAME_TRAINING.model_copy(update={"launcher": "accelerate", "processes": 2})
    )
    single = run_training(single_spec, root / "single.log")
    summaries: list[TrainSummary] = []

    @asset
    def two_process_training(context) -> MaterializeResult:  # type: ignore[no-untyped-def]  # Dagster reads it
        summaries.append(run_training(two_spec, root / "two.log", context))
        return MaterializeResult()

    instance = DagsterInstance.ephemeral()
    assert materialize([two_process_training], instance=instance).success
    logged = [e.user_message for run in instance.get_runs() for e in instance.all_logs(run.run_id)]
    return Runs(
        base_model_dir=Path(single_spec.base_model_dir),
        single=single,
        single_dir=Path(single_spec.output_dir),
        two=summaries[0],
        two_dir=Path(two_spec.output_dir),
        run_log=logged,
    )


def test_two_cpu_processes_take_the_same_steps_as_one(runs: Runs) -> None:
    from safetensors.torch import load_file

    assert (runs.single.processes, runs.two.processes) == (1, 2)
    assert runs.two.steps == runs.single.steps == 8
    # Counts are of the whole step (every row, once), whatever the number of processes.
    assert (runs.two.tokens, runs.two.trained_tokens) == (runs.single.tokens, runs.single.trained_tokens)
    assert [s for s, _ in runs.two.loss_curve] == list(range(1, 9))
    for (_, one), (_, two) in zip(runs.single.loss_curve, runs.two.loss_curve, strict=True):
        assert two == pytest.approx(one, abs=2e-4)  # the group's token-mean loss, summed over the processes
    assert runs.two.final_loss < runs.two.loss_curve[0][1]  # it learned
    one_weights = load_file(runs.single_dir / "adapter_model.safetensors")
    two_weights = load_file(runs.two_dir / "adapter_model.safetensors")
    assert one_weights.keys() == two_weights.keys()
    # Each tensor the same up to float summation order, judged by its norm: Adam's normalised step turns a
    # gradient that is zero but for rounding into a whole step (lr) of either sign, so a single element may
    # differ by about lr (1.5e-3 seen for one of 50k) while no tensor does (0.09% of its norm at most, seen).
    # A process that trained on half the rows, or skipped the all-reduce, moves lora_B by tens of percent.
    drift = {k: float((one_weights[k] - two_weights[k]).norm() / one_weights[k].norm()) for k in one_weights}
    assert max(drift.values()) < 1e-2, sorted(drift.items(), key=lambda item: -item[1])[:3]
    # Written once, atomically, by the main process: the version folder and nothing half-written beside it.
    assert sorted(p.name for p in runs.two_dir.parent.iterdir()) == [runs.two_dir.name]
    written = json.loads((runs.two_dir / TRAINING_SUMMARY).read_text())
    assert written["processes"] == 2 and written["loss_curve"] == [list(p) for p in runs.two.loss_curve]


def test_only_the_main_process_reports_to_the_run(runs: Runs) -> None:
    steps = [m for m in runs.run_log if m.startswith("step ")]
    assert [m.split(" loss")[0] for m in steps] == [f"step {n}/8" for n in range(1, 9)]
    starts = [m for m in runs.run_log if m.startswith("trainer start:")]
    assert len(starts) == 1 and json.loads(starts[0].removeprefix("trainer start:"))["processes"] == 2


def _first_step(process: Any) -> dict[str, Any]:
    for line in process.stdout:
        if line.startswith("{"):
            event = json.loads(line)
            if event["event"] == "step":
                return event
    raise AssertionError(f"the trainers ended (code {process.wait()}) before their first step")


def test_stopping_the_launcher_stops_every_trainer_and_leaves_no_adapter(
    settings: Settings, tmp_path: Path
) -> None:
    training = CODENAME_TRAINING.model_copy(
        update={"max_steps": 10_000, "launcher": "accelerate", "processes": 2}
    )
    spec = _spec(settings, tmp_path, "stopped", training)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    process = start_trainer("train", spec_path, tmp_path / "train.log", training=training)
    event = _first_step(process)
    assert event["step"] == 1 and event["loss"] > 0
    trainers = psutil.Process(process.pid).children(recursive=True)
    workers = [p for p in trainers if "lanes_pipeline.gpu_lane.training" in " ".join(p.cmdline())]
    assert len(workers) >= 2, [p.cmdline() for p in trainers]
    stop(process)
    assert process.returncode != 0
    _gone, alive = psutil.wait_procs(trainers, timeout=30)
    assert alive == []
    # The main trainer got SIGTERM and removed its staging folder: no version, not even a hidden half one.
    assert list(Path(spec.output_dir).parent.iterdir()) == []


# A run process that starts the trainers, says so once they step, and waits: the test SIGKILLs it.
_RUN_PROCESS = """
import sys, time
from pathlib import Path
from lanes_pipeline.gpu_lane.training.runner import start_trainer
from lanes_pipeline.gpu_lane.training.spec import TrainSpec
spec = TrainSpec.model_validate_json(Path(sys.argv[1]).read_text())
process = start_trainer("train", Path(sys.argv[1]), Path(sys.argv[2]), training=spec.training)
for line in process.stdout:
    if line.startswith('{"event": "step"'):
        print("stepping", flush=True)
        break
time.sleep(600)
"""


def test_a_killed_run_process_takes_the_launcher_and_every_trainer_with_it(
    settings: Settings, tmp_path: Path
) -> None:
    training = CODENAME_TRAINING.model_copy(
        update={"max_steps": 10_000, "launcher": "accelerate", "processes": 2}
    )
    spec = _spec(settings, tmp_path, "orphaned", training)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    run = subprocess.Popen(
        [sys.executable, "-c", _RUN_PROCESS, str(spec_path), str(tmp_path / "train.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout is not None and run.stdout.readline().strip() == "stepping"
        trainers = psutil.Process(run.pid).children(recursive=True)
        assert len(trainers) >= 3, [p.cmdline() for p in trainers]  # the launcher and two trainers
        run.kill()  # SIGKILL: nothing in the run process gets to clean up
        run.wait()
        _gone, alive = psutil.wait_procs(trainers, timeout=60)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        run.kill()
        run.wait()
    # Each trainer got SIGTERM (the launcher's, or its own parent-death signal) and the main one removed its
    # staging folder: no version, not even a hidden half one.
    assert list(Path(spec.output_dir).parent.iterdir()) == []


def _ask(url: str, model: str) -> str:
    messages = [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=PROBE_QUESTION)]
    with VllmClient(url, timeout_s=120) as client:
        return client.chat(ChatRequest(model=model, messages=messages, max_tokens=24)).text


def test_vllm_serves_the_adapter_two_processes_trained(
    runs: Runs, gpu_server: EmbeddedServer, settings: Settings
) -> None:
    lane = settings.lanes.gpu_lane
    check_adapter_dir(runs.two_dir, lane.max_lora_rank, supported_target_modules(runs.base_model_dir))
    name = "two-processes"
    with VllmClient(gpu_server.url, timeout_s=120) as client:
        assert "added successfully" in client.load_adapter(name, str(runs.two_dir))
        try:
            card = {c.id: c for c in client.adapters()}[name]
            assert card.root == str(runs.two_dir) and card.parent == lane.served_model_name
            assert CODENAME in _ask(gpu_server.url, name)
            assert CODENAME not in _ask(gpu_server.url, lane.served_model_name)
        finally:
            client.unload_adapter(name)

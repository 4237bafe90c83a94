"""Starting the trainer process from the run process, hearing what it reports, and ending it.

The run process never imports the model: it writes a spec file and starts
`python -m lanes_pipeline.gpu_lane.training`. Given a Dagster context (an asset), it runs the process in a
Dagster Pipes session: the trainer's progress lands in the run's log as it happens, and its results come
back as Pipes messages. Without one (the benchmark, a script), the trainer prints JSON lines and this reads
them. Whatever happens to the run (an error, an interrupt, Dagster terminating it) the trainer is stopped
before this returns or raises.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    OpExecutionContext,
    PipesTempFileContextInjector,
    PipesTempFileMessageReader,
    open_pipes_session,
)

from lanes_pipeline.errors import log_tail
from lanes_pipeline.gpu_lane.training.launch import trainer_argv
from lanes_pipeline.gpu_lane.training.spec import EvalReport, EvalSpec, Spec, TrainSpec, TrainSummary
from lanes_pipeline.settings import TrainingConfig

Event = dict[str, Any]
DagsterContext = AssetExecutionContext | OpExecutionContext
STOP_GRACE_S = 15.0


class TrainingError(RuntimeError):
    """The trainer failed. `returncode` < 0: it was killed by a signal (the OOM killer, a shutdown), which
    may not happen again; > 0: it raised (bad data, device or config), which will."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        self.returncode = returncode
        super().__init__(message)

    @property
    def transient(self) -> bool:
        return self.returncode is not None and self.returncode < 0


def run_training(spec: TrainSpec, log_path: Path, context: DagsterContext | None = None) -> TrainSummary:
    events = _run("train", spec, log_path, context)
    done = [e for e in events if e.get("event") == "done"]
    if not done:
        raise TrainingError(f"the trainer ended without a result; log: {log_path}\n{log_tail(log_path)}")
    return TrainSummary.model_validate(done[-1]["summary"])


def run_evaluation(spec: EvalSpec, log_path: Path, context: DagsterContext | None = None) -> EvalReport:
    events = _run("eval", spec, log_path, context)
    reports = [e for e in events if e.get("event") == "eval"]
    if not reports:
        raise TrainingError(f"the evaluation ended without a result; log: {log_path}\n{log_tail(log_path)}")
    return EvalReport.model_validate({k: v for k, v in reports[-1].items() if k != "event"})


def start_trainer(
    command: str,
    spec_path: Path,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    pipe: bool = True,
    training: TrainingConfig | None = None,
) -> subprocess.Popen[str]:
    """The trainer process (under `accelerate launch` when `training.launcher` says so: then the launcher,
    whose processes report through its main one); its stderr (and stdout, unless `pipe`) appended to
    `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        return subprocess.Popen(
            trainer_argv(command, spec_path, training, cpus=os.cpu_count() or 1),
            stdout=subprocess.PIPE if pipe else log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env={**trainer_env(), **(env or {})},
        )


def trainer_env() -> dict[str, str]:
    """The trainer's environment. OpenMP threads that wait passively: with busy-waiting ones, a CPU shared
    with the lanes' servers made each step 2-5x slower (measured on 2 cores: 7-16 s instead of 3.3 s for
    one forward and backward of 4 x 48 tokens through SmolLM2-135M). A value the user set is kept."""
    return {
        **os.environ,
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def _run(command: str, spec: Spec, log_path: Path, context: DagsterContext | None) -> list[Event]:
    with tempfile.TemporaryDirectory(prefix="lanes-train-") as scratch:
        spec_path = Path(scratch) / "spec.json"
        spec_path.write_text(spec.model_dump_json(indent=1))
        if context is None:
            code, events = _run_printing(command, spec_path, log_path, spec.training)
        else:
            code, events = _run_in_pipes(command, spec_path, log_path, context, spec.training)
    if code != 0:
        raise TrainingError(
            f"the trainer ({command}) exited with code {code}; log: {log_path}\n--- last lines ---\n"
            f"{log_tail(log_path)}",
            returncode=code,
        )
    return events


def _run_in_pipes(
    command: str, spec_path: Path, log_path: Path, context: DagsterContext, training: TrainingConfig
) -> tuple[int, list[Event]]:
    """Progress to the run's log as it happens; the results are the session's custom messages."""
    with open_pipes_session(
        context=context,
        context_injector=PipesTempFileContextInjector(),
        message_reader=PipesTempFileMessageReader(),
    ) as session:
        process = start_trainer(
            command, spec_path, log_path, session.get_bootstrap_env_vars(), pipe=False, training=training
        )
        try:
            code = process.wait()
        finally:
            stop(process)
    return code, [m for m in session.get_custom_messages() if isinstance(m, dict) and "event" in m]


def _run_printing(
    command: str, spec_path: Path, log_path: Path, training: TrainingConfig
) -> tuple[int, list[Event]]:
    """Outside Dagster: the trainer prints one JSON event per line."""
    process = start_trainer(command, spec_path, log_path, training=training)
    events: list[Event] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            event = _parse(line)
            if event is not None:
                events.append(event)
        code = process.wait()
    finally:
        stop(process)
    return code, events


def _parse(line: str) -> Event | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM (the trainer removes its staging folder), then SIGKILL if it does not end in time."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    timer = threading.Timer(STOP_GRACE_S, process.kill)
    timer.start()
    try:
        process.wait()
    finally:
        timer.cancel()

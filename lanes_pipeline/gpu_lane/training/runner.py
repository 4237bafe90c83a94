"""Starting the trainer process from the run process, relaying its JSON progress lines, and ending it.

The run process never imports the model: it writes a spec file, starts
`python -m lanes_pipeline.gpu_lane.training`,
and hands every progress event to a callback (the asset logs them to Dagster). Whatever happens to the run
(an error, an interrupt, Dagster terminating it) the trainer is stopped before this returns or raises.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lanes_pipeline.errors import log_tail
from lanes_pipeline.gpu_lane.training.spec import EvalResult, EvalSpec, Spec, TrainSpec, TrainSummary

Event = dict[str, Any]
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


def run_training(spec: TrainSpec, on_event: Callable[[Event], None], log_path: Path) -> TrainSummary:
    events = _run("train", spec, on_event, log_path)
    done = [e for e in events if e.get("event") == "done"]
    if not done:
        raise TrainingError(f"the trainer ended without a result; log: {log_path}\n{log_tail(log_path)}")
    return TrainSummary.model_validate(done[-1]["summary"])


def run_evaluation(spec: EvalSpec, on_event: Callable[[Event], None], log_path: Path) -> list[EvalResult]:
    events = _run("eval", spec, on_event, log_path)
    return [
        EvalResult.model_validate({k: v for k, v in e.items() if k != "event"})
        for e in events
        if e["event"] == "eval"
    ]


def start_trainer(command: str, spec_path: Path, log_path: Path) -> subprocess.Popen[str]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "lanes_pipeline.gpu_lane.training", command, str(spec_path)],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=trainer_env(),
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


def _run(command: str, spec: Spec, on_event: Callable[[Event], None], log_path: Path) -> list[Event]:
    with tempfile.TemporaryDirectory(prefix="lanes-train-") as scratch:
        spec_path = Path(scratch) / "spec.json"
        spec_path.write_text(spec.model_dump_json(indent=1))
        process = start_trainer(command, spec_path, log_path)
        events: list[Event] = []
        try:
            assert process.stdout is not None
            for line in process.stdout:
                event = _parse(line)
                if event is None:
                    continue
                events.append(event)
                on_event(event)
            code = process.wait()
        finally:
            stop(process)
    if code != 0:
        raise TrainingError(
            f"the trainer ({command}) exited with code {code}; log: {log_path}\n--- last lines ---\n"
            f"{log_tail(log_path)}",
            returncode=code,
        )
    return events


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

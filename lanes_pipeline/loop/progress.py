"""What `lanes run` shows while the day runs: each step as it starts and ends, numbered in the day's order,
and what the step logs as it goes (a CPU-lane batch's items done of all with its ETA, the trainer's steps).

One source, two places: a step's events and its `context.log` lines go to the run's event log (the UI shows
them, as for any run), and this Dagster logger prints the same ones on the terminal as they happen.
`lanes run` switches it on for the runs it executes in its own process (run config `loggers`) and turns
Dagster's own console logger down to warnings and errors, whose step failures it still prints in full; a
run the daemon launches leaves both loggers unconfigured and keeps Dagster's default console logging.

`StepLines` is the pure part: what a step's event or message makes of the terminal, given the time.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dagster import Field, InitLoggerContext, logger

from lanes_pipeline.cpu_lane.batching.batch_summary import format_duration

TERMINAL_LOGGER = "lanes_terminal"
PREFIX = "[lanes]"

Kind = Literal["start", "success", "failure", "skipped", "retry", "message"]


@dataclass(frozen=True)
class StepEvent:
    """What the terminal needs of one Dagster log record."""

    kind: Kind
    step: str | None  # None: a run-level event or message
    message: str = ""


class StepLines:
    """The day's steps in order (`steps`, step keys); each event becomes the terminal's lines. A step not
    listed (an asset check) shows only when it fails or is retried."""

    def __init__(self, steps: Sequence[str]) -> None:
        self.steps = list(steps)
        self._started: dict[str, float] = {}

    def _name(self, step: str) -> str:
        if step in self.steps:
            return f"step {self.steps.index(step) + 1}/{len(self.steps)} {step}"
        return f"check {step}"

    def lines(self, event: StepEvent, now: float) -> list[str]:
        step = event.step
        if step is None:
            return []
        listed = step in self.steps
        if event.kind == "start":
            self._started[step] = now
            return [f"{PREFIX} {self._name(step)} ..."] if listed else []
        took = now - self._started[step] if step in self._started else None
        after = f" after {format_duration(took)}" if took is not None else ""
        if event.kind == "success":
            return [f"{PREFIX} {self._name(step)}: done in {format_duration(took or 0.0)}"] if listed else []
        if event.kind == "failure":
            return [f"{PREFIX} {self._name(step)}: FAILED{after} (Dagster's error above)"]
        if event.kind == "retry":
            return [f"{PREFIX} {self._name(step)}: failed{after}, to be retried"]
        if event.kind == "skipped":
            return [f"{PREFIX} {self._name(step)}: skipped (an upstream step did not materialize)"]
        text = event.message.strip()
        return [f"{PREFIX}     {step}: {line}" for line in text.splitlines()] if text else []


def step_event(record: logging.LogRecord) -> StepEvent | None:
    """The event or message a Dagster log record carries (`dagster_meta`, which Dagster attaches to every
    record it hands a run's loggers); None for what the terminal leaves out (debug chatter, other events)."""
    meta = getattr(record, "dagster_meta", None)
    if not isinstance(meta, dict):
        return None
    step, event = meta.get("step_key"), meta.get("dagster_event")
    if event is None:
        if record.levelno < logging.INFO:
            return None
        return StepEvent("message", step, str(meta.get("orig_message", "")))
    kinds: list[tuple[bool, Kind]] = [
        (event.is_step_start, "start"),
        (event.is_step_success, "success"),
        (event.is_step_failure, "failure"),
        (event.is_step_up_for_retry, "retry"),
        (event.is_step_skipped, "skipped"),
    ]
    return next((StepEvent(kind, step) for matched, kind in kinds if matched), None)


class _Terminal(logging.Handler):
    """Prints each record's lines on the process's stdout as it is then (a test's capture included)."""

    def __init__(self, steps: Sequence[str]) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines = StepLines(steps)

    def emit(self, record: logging.LogRecord) -> None:
        event = step_event(record)
        if event is None:
            return
        for line in self.lines.lines(event, time.monotonic()):
            sys.stdout.write(line + "\n")
        sys.stdout.flush()


@logger(
    config_schema={"steps": Field([str], default_value=[], description="the day's step keys, in order")},
    description="`lanes run`'s terminal: each step of the day as it starts and ends, and what it logs.",
)
def terminal_logger(init_context: InitLoggerContext) -> logging.Logger:
    # A logger of its own per run, not registered in `logging`: nothing else writes through it.
    log = logging.Logger(TERMINAL_LOGGER, level=logging.DEBUG)
    log.addHandler(_Terminal(init_context.logger_config["steps"]))
    return log


def run_loggers(steps: Sequence[str], verbose: bool) -> dict[str, dict[str, object]]:
    """The run config's `loggers` for a run `lanes run` executes: this terminal, and Dagster's console
    logger at warnings (`verbose`: every event, as `dagster dev` shows them)."""
    return {
        TERMINAL_LOGGER: {"config": {"steps": list(steps)}},
        "console": {"config": {"log_level": "DEBUG" if verbose else "WARNING"}},
    }

"""How the trainer process reports progress and results: through Dagster Pipes when an asset launched it
(structured Dagster logs, results as Pipes messages), else as one JSON object per line on stdout (the
command line, the benchmark, the tests that watch a bare trainer).

Both carry the same events: `start`, `step` (progress), `done` (the training summary), `eval` (the eval
report). Only this module knows Pipes; the trainer calls `event()`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

# Events the caller needs back (not just logs): the training summary, the eval report.
RESULT_EVENTS = frozenset({"done", "eval"})
LOG_LINES = 50  # step lines of a long run in the Dagster log: about this many


class Progress(Protocol):
    def event(self, name: str, **fields: Any) -> None: ...


class JsonLines:
    """`{"event": name, ...}` per line on stdout, flushed: what `runner.py` reads outside Dagster."""

    def event(self, name: str, **fields: Any) -> None:
        print(json.dumps({"event": name, **fields}), flush=True)


def step_line(fields: dict[str, Any]) -> str | None:
    """The log line of a step event: every step of a short run, about LOG_LINES of a long one (the first
    and last always: the first says training has started, and how fast)."""
    step, total = int(fields["step"]), int(fields.get("total_steps") or 1)
    every = max(1, total // LOG_LINES)
    if step % every != 0 and step not in (1, total):
        return None
    return (
        f"step {step}/{total} loss {fields['loss']:.4f} {fields['tokens_per_s']:.0f} tok/s "
        f"({fields['elapsed_s']:.0f} s)"
    )


class PipesProgress:
    """Events to the Dagster run that launched this process: steps and starts as log lines, results as
    Pipes custom messages (the asset turns them into metadata)."""

    def __init__(self, pipes: Any) -> None:
        self.pipes = pipes  # dagster_pipes.PipesContext

    def event(self, name: str, **fields: Any) -> None:
        if name == "step":
            line = step_line(fields)
            if line is not None:
                self.pipes.log.info(line)
        elif name in RESULT_EVENTS:
            self.pipes.report_custom_message({"event": name, **fields})
        else:
            self.pipes.log.info(f"trainer {name}: {json.dumps(fields)}")


@contextmanager
def open_progress() -> Iterator[Progress]:
    """Pipes when launched by a Dagster asset (its bootstrap variables are in the environment), else JSON
    lines. Under Pipes, an exception is reported to the run before the process exits non-zero."""
    from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes

    if not PipesEnvVarParamsLoader().is_dagster_pipes_process():
        yield JsonLines()
        return
    with open_dagster_pipes() as pipes:
        yield PipesProgress(pipes)

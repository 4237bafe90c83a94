"""Stopping a long-running command stops everything it started, whatever stops it.

Ctrl-C raises KeyboardInterrupt, and every command's `with`/`finally` cleanup then stops its servers and
children. SIGTERM (`kill`, `systemctl stop`, `docker stop`) and SIGHUP (the terminal or ssh session went
away) would end the process at once instead, leaving llama-server, vLLM and `dagster dev` running and
holding their ports. `stop_like_ctrl_c()` makes both act as Ctrl-C.

A child that starts children of its own (`dagster dev`: webserver, daemon, code servers, run workers, their
compute-log `tail -F`) runs in its own process group (`child_group`): on leaving, the child gets SIGINT (what
Ctrl-C in a terminal gives it) and a grace period to shut its own children down, then whatever is left of
the group is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import IO, Any

from lanes_pipeline.steps import STOP_REQUESTED

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stop_like_ctrl_c() -> None:
    """From now on SIGTERM and SIGHUP are handled as SIGINT is at that moment: KeyboardInterrupt, or, while
    Dagster executes a run in this process, Dagster's own interrupt handler (the run stops at its next
    checkpoint and is marked so). Signal handlers belong to the main thread: elsewhere (a command invoked
    from a worker thread) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, _as_ctrl_c)


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    STOP_REQUESTED.set()  # no step starts any more, a retried one included (host.refuse_after_stop)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored or at its default: stop as an unhandled Ctrl-C would
        raise KeyboardInterrupt


def raise_if_stopped() -> None:
    """Raise KeyboardInterrupt if a stop signal arrived. The handler's own KeyboardInterrupt can be lost: one
    raised while a weakref callback or `__del__` runs (SQLAlchemy's, in a garbage collection during an
    instance query) is printed as "Exception ignored" and dropped, and a loop that waits on the instance
    would wait forever. The flag the handler sets first is not lost."""
    if STOP_REQUESTED.is_set():
        raise KeyboardInterrupt


def sleep_unless_stopped(seconds: float | None = None) -> None:
    """Sleep `seconds` (None: until a stop), ending at once with KeyboardInterrupt when a stop signal arrives,
    also one whose own KeyboardInterrupt was lost before the sleep began (`raise_if_stopped`)."""
    STOP_REQUESTED.wait(seconds)
    raise_if_stopped()


@contextmanager
def child_group(
    argv: Sequence[str],
    *,
    cwd: Path,
    grace_s: float,
    env: dict[str, str] | None = None,
    stdout: IO[Any] | int | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` in a process group of its own for the body; on leaving (normally, on an error, on Ctrl-C,
    SIGTERM or SIGHUP) stop it and everything it started."""
    process = subprocess.Popen(
        list(argv), cwd=cwd, env=env, stdout=stdout, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        yield process
    finally:
        stop_group(process, grace_s)


def stop_group(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGINT to the group's leader, up to `grace_s` for it to stop its children, then SIGKILL to whatever
    is left of the group. A second stop signal while waiting skips the rest of the grace period."""
    try:
        if process.poll() is None:
            with suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)
    except KeyboardInterrupt:
        pass
    finally:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

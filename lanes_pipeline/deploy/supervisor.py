"""A plain process supervisor for one rendered unit, where systemd is not running (containers, CI, this
machine): what systemd would do with the keys `lanes service` writes and nothing more.

ExecStartPre commands run first and must succeed; ExecStart runs in a process group of its own with the
unit's Environment in its WorkingDirectory; each ExecStartPost runs once it started ($MAINPID is its pid);
when it ends on its own with a failure (a non-zero code or a signal) and Restart= says so, whatever is left
of its group is killed (KillMode=control-group), ExecStopPost runs, and it starts again after RestartSec.
`stop()` sends SIGTERM to the group, waits TimeoutStopSec, then SIGKILLs what is left, then runs ExecStopPost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from contextlib import suppress
from typing import IO, Any

import psutil

from lanes_pipeline.deploy.service_units import Unit

# systemd starts a service with an almost empty environment; these few come from the caller's.
INHERITED = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR")


class SupervisorError(RuntimeError):
    """A unit's command could not be run as the unit says (a failed ExecStartPre or ExecStartPost)."""


class Supervisor:
    """Runs one unit in a background thread; `start()`, then `stop()` (or use it as a context manager)."""

    def __init__(
        self, unit: Unit, base_env: Mapping[str, str] | None = None, output: IO[Any] | int | None = None
    ) -> None:
        self.unit = unit
        source = os.environ if base_env is None else base_env
        self.env = {key: source[key] for key in INHERITED if key in source} | unit.environment
        self.output = output
        self.starts = 0  # how many times ExecStart was started (1 + restarts)
        self.exit_codes: list[int] = []  # each ended main process's return code (negative: its signal)
        self._process: subprocess.Popen[bytes] | None = None
        self._group: set[int] = set()  # every process seen in the unit's group: what stop must reach
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def _run(self, argv: list[str], what: str) -> None:
        # parse_unit keeps $MAINPID as a word of its own: only now is the pid known
        command = [str(self.pid or "") if arg == "$MAINPID" else arg for arg in argv]
        result = subprocess.run(
            command, env=self.env, cwd=self.unit.working_directory, stdout=self.output, stderr=self.output
        )
        if result.returncode != 0:
            raise SupervisorError(f"{self.unit.name}: {what} `{' '.join(argv)}` exited {result.returncode}")

    def _spawn(self) -> None:
        for argv in self.unit.exec_start_pre:
            self._run(argv, "ExecStartPre")
        with self._lock:
            self._process = subprocess.Popen(
                self.unit.exec_start,
                env=self.env,
                cwd=self.unit.working_directory,
                stdin=subprocess.DEVNULL,
                stdout=self.output,
                stderr=self.output,
                start_new_session=True,
            )
            self.starts += 1
        for argv in self.unit.exec_start_post:
            self._run(argv, "ExecStartPost")

    def start(self) -> Supervisor:
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name=f"supervise {self.unit.name}", daemon=True)
        self._thread.start()
        return self

    def _remember_group(self) -> None:
        process = self._process
        if process is None:
            return
        with suppress(psutil.Error):
            self._group.add(process.pid)
            self._group.update(child.pid for child in psutil.Process(process.pid).children(recursive=True))

    def _watch(self) -> None:
        while not self._stopping.is_set():
            process = self._process
            assert process is not None
            self._remember_group()
            code = process.poll()
            if code is None:
                self._stopping.wait(0.2)
                continue
            with self._lock:
                if self._stopping.is_set():  # stop() owns this ending
                    return
                self.exit_codes.append(code)
                self._kill_group()
            self._stop_post()
            if not self._restarts_on(code):
                return
            if self._stopping.wait(self.unit.restart_sec):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
            try:
                self._spawn()
            except (SupervisorError, OSError):
                return  # systemd would mark the unit failed; it is not restarted either

    def _restarts_on(self, code: int) -> bool:
        return self.unit.restart == "always" or (self.unit.restart == "on-failure" and code != 0)

    def _kill_group(self) -> None:
        """SIGKILL everything left of the unit's processes (its group, and any child seen that left it)."""
        process = self._process
        if process is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        for pid in self._group:
            with suppress(psutil.Error):
                psutil.Process(pid).kill()
        self._group.clear()

    def _stop_post(self) -> None:
        for argv in self.unit.exec_stop_post:
            with suppress(SupervisorError, OSError):  # as systemd: a failed ExecStopPost is only logged
                self._run(argv, "ExecStopPost")

    def stop(self) -> int | None:
        """Stop the unit as `systemctl stop` would; return the last main process's return code."""
        with self._lock:
            self._stopping.set()
            process = self._process
        if self._thread is not None:
            self._thread.join()
        if process is None:
            return None
        self._remember_group()
        if process.poll() is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.unit.timeout_stop_s
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
        self._kill_group()
        code = process.wait()
        self._stop_post()
        return code

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

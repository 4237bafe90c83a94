"""The daemon runs from its rendered unit: the plain supervisor (no systemd here) starts what the unit text
says, the daemon heartbeats into the instance, a SIGKILLed daemon is started again (Restart=on-failure), and
stopping leaves no process behind."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from dagster import DagsterInstance

from lanes_pipeline.cli.service import gather_spec
from lanes_pipeline.deploy.instance import CPU_POOL, GPU_POOL, pool_limits
from lanes_pipeline.deploy.service_units import DAEMON, Unit, parse_unit, render_systemd
from lanes_pipeline.deploy.supervisor import Supervisor, SupervisorError
from lanes_pipeline.settings import Settings
from lanes_pipeline_tests.core.processes import family, survivors

HEARTBEAT_TIMEOUT_S = 180.0  # the daemon loads the definitions in a code server first; 2 busy cores are slow


def _wait(what: str, check: Callable[[], object], timeout_s: float) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout_s:.0f} s")


def _daemon_ids(home: Path) -> set[str]:
    """The ids of the daemons that heartbeat into this instance (a daemon process has one id)."""
    with DagsterInstance.from_config(str(home)) as instance:
        return {beat.daemon_id for beat in instance.get_daemon_heartbeats().values()}


@pytest.mark.slow
def test_daemon_runs_from_its_unit_and_is_restarted(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, data = tmp_path / "dagster_home", tmp_path / "data"
    spec = gather_spec(settings, "user", "127.0.0.1", 3000, None)
    # A private instance and data folder: nothing of the project's own instance is touched.
    spec = spec.model_copy(update={"dagster_home": home, "data_dir": data})
    unit = parse_unit(render_systemd(spec)[DAEMON], DAEMON)
    assert unit.environment["DAGSTER_HOME"] == str(home) and unit.restart == "on-failure"
    fast = unit.model_copy(update={"restart_sec": 1.0, "timeout_stop_s": 30})  # systemd's waits, shortened
    monkeypatch.setenv("DAGSTER_HOME", str(home))

    log = (tmp_path / "daemon.log").open("wb")
    seen: dict[int, str] = {}
    with Supervisor(fast, output=log) as supervisor:
        try:
            # ExecStartPre ran `lanes service prepare`: the instance links the project's dagster.yaml and
            # has the pool limits from the configs, as under `lanes dev`.
            assert (home / "dagster.yaml").resolve() == settings.project_root / "dagster.yaml"
            first = _wait("daemon heartbeat", lambda: _daemon_ids(home), HEARTBEAT_TIMEOUT_S)
            with DagsterInstance.from_config(str(home)) as instance:
                limits = {info.name: info.limit for info in instance.event_log_storage.get_pool_limits()}
            assert {CPU_POOL: limits[CPU_POOL], GPU_POOL: limits[GPU_POOL]} == pool_limits(settings)

            killed = supervisor.pid
            assert killed is not None
            seen |= family(killed)
            os.kill(killed, signal.SIGKILL)  # a crash, as the OOM killer would do it
            _wait("restart", lambda: supervisor.starts == 2 and supervisor.pid not in (None, killed), 30)
            assert supervisor.exit_codes == [-signal.SIGKILL]
            again = _wait(
                "new daemon's heartbeat", lambda: _daemon_ids(home) - set(first), HEARTBEAT_TIMEOUT_S
            )
            assert again
            assert supervisor.pid is not None
            seen |= family(supervisor.pid)
        except BaseException:
            log.flush()
            sys.stderr.write((tmp_path / "daemon.log").read_text(errors="replace")[-4000:])
            raise
    assert survivors(seen) == {}, "the daemon or its code server outlived the stop"
    assert supervisor.starts == 2


def test_a_clean_exit_is_not_restarted(tmp_path: Path) -> None:
    done = tmp_path / "ran"
    unit = Unit(
        name="once.service",
        description="exits 0",
        exec_start=["/bin/sh", "-c", f"echo $GREETING >> {done}"],
        environment={"GREETING": "hello"},
        working_directory=tmp_path,
        restart_sec=0.2,
    )
    with Supervisor(unit) as supervisor:
        _wait("exit", lambda: supervisor.exit_codes, 10)
        time.sleep(1.0)  # several RestartSec: Restart=on-failure must not start it again
        assert supervisor.starts == 1 and supervisor.exit_codes == [0]
    assert done.read_text() == "hello\n"  # the unit's Environment reached the command


def test_a_failing_start_pre_stops_the_start_and_names_it(tmp_path: Path) -> None:
    unit = Unit(
        name="guarded.service",
        description="its ExecStartPre fails",
        exec_start=["/bin/sleep", "60"],
        exec_start_pre=[["/bin/sh", "-c", "exit 3"]],
        environment={},
        working_directory=tmp_path,
    )
    supervisor = Supervisor(unit)
    with pytest.raises(SupervisorError, match=r"guarded.service: ExecStartPre `/bin/sh -c exit 3` exited 3"):
        supervisor.start()
    assert supervisor.starts == 0 and supervisor.pid is None

"""Stopping stops everything: each long-running command, sent SIGTERM (kill, systemctl stop, docker stop) or
SIGHUP (its terminal went away), stops as on Ctrl-C, and no process it started outlives it nor holds a port.
(`lanes serve` is proven in test_lanes_embedded.py.)"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml
from click.testing import CliRunner
from dagster import DagsterInstance, DagsterRunStatus, MaterializeResult, RetryPolicy, asset, materialize

from lanes_pipeline.cli.run import stop_if_interrupted
from lanes_pipeline.cli.stopping import STOP_SIGNALS, stop_like_ctrl_c
from lanes_pipeline.deploy.instance import NOT_FINISHED
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.settings import Settings, project_root
from lanes_pipeline.steps import STOP_REQUESTED, asset_step
from lanes_pipeline_tests.config_files import read_config, write_config
from lanes_pipeline_tests.core.processes import family, free_port, port_is_free, survivors
from lanes_pipeline_tests.daily.fixtures import DailyProject, daily_project

# The module, not the `backfill` command that `lanes_pipeline.cli` exports under the same name.
backfill_cli = importlib.import_module("lanes_pipeline.cli.backfill")

LANES = [sys.executable, "-m", "lanes_pipeline.cli"]


def _embedded_on_free_ports(project: DailyProject, lanes: tuple[str, ...]) -> None:
    """The project's `lanes` run embedded, each on a free port."""
    path = project.config_dir / "lanes.yaml"
    config = read_config(path)
    for lane in lanes:
        config[f"{lane}_lane"]["base_url"] = "embedded"
        config[f"{lane}_lane"]["embedded"]["port"] = 0
    write_config(path, config)


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            cwd=project_root(),
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for(
    what: str, done: Callable[[], bool], process: subprocess.Popen[bytes], log: Path, s: float
) -> None:
    deadline = time.monotonic() + s
    while not done():
        assert process.poll() is None, f"exited before {what}:\n{log.read_text(errors='replace')[-3000:]}"
        assert time.monotonic() < deadline, (
            f"no {what} within {s:.0f} s:\n{log.read_text(errors='replace')[-3000:]}"
        )
        time.sleep(0.5)


def _stop_and_check(
    process: subprocess.Popen[bytes], sig: signal.Signals, log: Path, ports: list[int], within_s: float
) -> tuple[int, dict[int, str]]:
    """Send `sig`; the command exits within `within_s`, none of its processes survives, its ports are free."""
    tree = family(process.pid)
    process.send_signal(sig)
    sent = time.monotonic()
    try:
        code = process.wait(timeout=within_s)
        print(f"{sig.name}: exited {time.monotonic() - sent:.1f} s after the signal")
    finally:
        if process.poll() is None:
            for pid in family(process.pid):
                os.kill(pid, signal.SIGKILL)
    left = survivors(tree)
    output = log.read_text(errors="replace")
    assert not left, f"still running after {sig.name}: {left}\n{output[-3000:]}"
    assert [port for port in ports if not port_is_free(port)] == [], output[-3000:]
    return code, tree


def test_only_an_interrupted_run_stops_lanes_run() -> None:
    """A run that succeeded or whose step failed is no interruption: `lanes run` goes on to the summary."""

    @asset
    def fine() -> int:
        return 1

    @asset
    def broken() -> None:
        raise ValueError("a step failure, not an interruption")

    with DagsterInstance.ephemeral() as instance:
        stop_if_interrupted(materialize([fine], instance=instance))
        failed = materialize([broken], instance=instance, raise_on_error=False)
    assert not failed.success
    stop_if_interrupted(failed)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_step_interrupted_mid_run_is_stopped_not_retried(sig: signal.Signals) -> None:
    """Dagster raises Ctrl-C and SIGTERM inside the executing step and, for a step with a retry policy,
    retries it after the policy's delay: the run went on (SIGTERM) or ended a delay later (SIGHUP, 44 s seen
    in `lanes run`). The step wrapper stops it instead: the step fails without a retry, the step after it
    refuses to run, and the run ends at once."""

    @asset(retry_policy=RetryPolicy(max_retries=2, delay=60))
    @asset_step
    def long_step() -> MaterializeResult:
        os.kill(os.getpid(), sig)
        time.sleep(30)  # interrupted here
        return MaterializeResult()

    @asset(deps=[long_step])
    @asset_step
    def next_step() -> MaterializeResult:
        return MaterializeResult()

    started = time.monotonic()
    try:
        with DagsterInstance.ephemeral() as instance:
            result = materialize([long_step, next_step], instance=instance, raise_on_error=False)
        took = time.monotonic() - started
        events = {event.event_type_value for event in result.all_events}
        assert not result.success
        assert "STEP_UP_FOR_RETRY" not in events
        assert STOP_REQUESTED.is_set()
        assert took < 20, f"the run took {took:.0f} s: the interrupted step waited for a retry"
        with pytest.raises(KeyboardInterrupt):  # and `lanes run` stops there
            stop_if_interrupted(result)
    finally:
        STOP_REQUESTED.clear()  # this process goes on running other tests' steps


@pytest.fixture
def project(settings: Settings, tmp_path: Path) -> DailyProject:
    """A private project whose lanes are unreachable until a test says otherwise."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    return daily_project(tmp_path, settings, nowhere, nowhere, seed_earlier_day=False)


@pytest.mark.timeout(300)
def test_lanes_backfill_stops_its_submission_and_its_waiting(project: DailyProject, tmp_path: Path) -> None:
    """SIGTERM while the backfill is being submitted stops dagster-graphql and the code server it started;
    SIGHUP while `--wait` waits ends the waiting (the backfill stays with the instance's daemon)."""
    argv = [*LANES, "backfill", "--from", "2026-11-01", "--to", "2026-11-02", "--wait"]
    log = tmp_path / "submit.log"
    submitting = _start(argv, project.env(), log)
    _wait_for(
        "dagster-graphql child",
        lambda: any("dagster-graphql" in cmd for cmd in family(submitting.pid).values()),
        submitting,
        log,
        120,
    )
    code, tree = _stop_and_check(submitting, signal.SIGTERM, log, [], within_s=60)
    assert code != 0 and any("dagster-graphql" in cmd for cmd in tree.values())
    with DagsterInstance.from_config(str(project.dagster_home)) as instance:
        assert instance.get_backfills() == []  # stopped before Dagster took it

    log = tmp_path / "wait.log"
    waiting = _start(argv, project.env(), log)
    _wait_for("the backfill's id", lambda: "daily_lanes for 2026-11-01" in log.read_text(), waiting, log, 180)
    code, _tree = _stop_and_check(waiting, signal.SIGHUP, log, [], within_s=30)
    assert code == 130
    assert "stopped waiting; backfill" in log.read_text()
    with DagsterInstance.from_config(str(project.dagster_home)) as instance:
        [backfill] = instance.get_backfills()
    assert backfill.status.value == "REQUESTED"  # no daemon here: still waiting for one


@pytest.mark.parametrize(
    ("wait", "stopped_in"), [(True, "daemons_alive"), (True, "wait_for"), (False, "daemons_alive")]
)
def test_a_stop_after_the_backfill_was_submitted_ends_the_command_as_a_stop(
    monkeypatch: pytest.MonkeyPatch, wait: bool, stopped_in: str
) -> None:
    """A signal that lands once Dagster has the backfill, also while the daemons' heartbeats are read (a
    slow instance query under load), ends the command with 130 and says the backfill goes on; it was an
    uncaught KeyboardInterrupt there, which click reports as "Aborted!" with exit 1."""

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(backfill_cli, "stop_like_ctrl_c", lambda: None)  # no handlers in pytest's process
    monkeypatch.setattr(backfill_cli, "load_settings", lambda: SimpleNamespace(project_root=Path(".")))
    monkeypatch.setattr(backfill_cli, "use_project_instance", lambda settings: None)
    monkeypatch.setattr(backfill_cli, "prepare_instance", lambda settings: None)
    monkeypatch.setattr(backfill_cli, "submit_backfill", lambda root, days, title, of_assets: "b1")
    monkeypatch.setattr(backfill_cli, "daemons_alive", lambda: True)
    monkeypatch.setattr(backfill_cli, stopped_in, interrupted)
    argv = ["--from", "2026-11-01", "--to", "2026-11-02", *(["--wait"] if wait else [])]
    result = CliRunner().invoke(backfill_cli.backfill, argv)
    assert result.exit_code == 130, result.output
    stopped = "stopped waiting" if wait else "stopped"
    assert f"{stopped}; backfill b1 goes on (Overview > Backfills)" in result.output
    assert "Aborted" not in result.output


class _Collected:
    """An object whose collection runs a weakref callback, as SQLAlchemy's registries do in a query."""


def _hang_up_inside_a_weakref_callback() -> None:
    """SIGHUP handled while a weakref callback runs: Python prints its KeyboardInterrupt as "Exception
    ignored" and drops it, as it did to `lanes backfill --wait` in a garbage collection during an instance
    query (the command then polled on, and CI's stop waited past its 30 s)."""

    def collected(ref: weakref.ref[_Collected]) -> None:
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(10_000):  # the handler runs at one of these bytecodes, inside the callback
            pass

    target = _Collected()
    ref = weakref.ref(target, collected)
    del target
    assert ref() is None


@pytest.mark.timeout(60)
def test_a_stop_whose_interrupt_was_swallowed_still_ends_the_backfill_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stop handler's flag outlives its lost KeyboardInterrupt: the wait ends at its next poll."""
    polls: list[str] = []

    class Instance:
        def get_backfill(self, backfill_id: str) -> SimpleNamespace:
            polls.append(backfill_id)
            _hang_up_inside_a_weakref_callback()
            return SimpleNamespace(status=SimpleNamespace(value="REQUESTED"))

        def get_runs(self, runs_filter: object) -> list[object]:
            return []

    monkeypatch.setattr(DagsterInstance, "get", staticmethod(Instance))
    lost: list[type[BaseException] | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: lost.append(unraisable.exc_type))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop_like_ctrl_c()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            backfill_cli.wait_for("b1", poll_s=20.0)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        STOP_REQUESTED.clear()
    assert lost == [KeyboardInterrupt]  # the handler's interrupt was dropped, as in CI
    assert polls == ["b1"]
    assert time.monotonic() - started < 5, "the wait slept through the stop"


@pytest.mark.timeout(900)
@pytest.mark.usefixtures("cpu_engine")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_lanes_run_stops_the_run_and_its_lane(
    project: DailyProject, gpu_server: EmbeddedServer, tmp_path: Path, sig: signal.Signals
) -> None:
    """`lanes run` with its own embedded CPU lane, hung up on or sent SIGTERM while the day's run executes:
    the run is stopped at once and recorded as such, the llama-server it started and every step's process
    are gone. (Dagster would retry the interrupted step after its retry policy's delay; the step wrapper
    stops it instead, host.stopped_step, and the steps after it refuse to run.)"""
    _embedded_on_free_ports(project, ("cpu",))
    # A day with minutes of CPU-lane work, so the hang-up lands mid-step (a small day ends in seconds).
    pipeline = read_config(project.config_dir / "pipeline.yaml")
    pipeline["cpu_assets"] |= {"backlog_per_day": 8, "samples_per_item": 6, "tests_max_tokens": 320}
    write_config(project.config_dir / "pipeline.yaml", pipeline)
    lanes = read_config(project.config_dir / "lanes.yaml")
    lanes["gpu_lane"]["base_url"] = gpu_server.url  # the session's vLLM: not this command's to stop
    write_config(project.config_dir / "lanes.yaml", lanes)
    log = tmp_path / "run.log"
    running = _start([*LANES, "run", "--date", "2026-11-01"], project.env(), log)
    state = project.data_dir / "run" / "cpu-lane.json"
    # A step is executing when Dagster mirrors its compute logs (`tail -F`) in the command's process tree.
    _wait_for(
        "an executing step",
        lambda: state.exists() and any(cmd.startswith("tail -F") for cmd in family(running.pid).values()),
        running,
        log,
        600,
    )
    cpu_port = int(yaml.safe_load(state.read_text())["url"].rsplit(":", 1)[1])
    code, tree = _stop_and_check(running, sig, log, [cpu_port], within_s=30)
    assert code == 130, log.read_text()[-3000:]
    assert any("llama-server" in cmd for cmd in tree.values()), tree
    assert not state.exists()
    with DagsterInstance.from_config(str(project.dagster_home)) as instance:
        runs = instance.get_runs()
    assert runs and not [run.run_id for run in runs if run.status in NOT_FINISHED]
    assert any(run.status == DagsterRunStatus.FAILURE for run in runs)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("cpu_engine", "gpu_engine")
def test_lanes_dev_stops_lanes_and_dagster_on_sigterm(project: DailyProject, tmp_path: Path) -> None:
    """`lanes dev` with both embedded lanes on free ports: once the UI answers, SIGTERM stops llama-server,
    vLLM, and `dagster dev` with its webserver and daemon; every port is free again."""
    _embedded_on_free_ports(project, ("cpu", "gpu"))
    ui_port = free_port()
    env = {**project.env()}
    log = tmp_path / "dev.log"
    dev = _start([*LANES, "dev", "--port", str(ui_port)], env, log)

    def ui_answers() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{ui_port}/server_info", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    _wait_for("the Dagster UI", ui_answers, dev, log, 600)
    _wait_for(
        "the daemon",
        lambda: any("dagster._daemon" in cmd for cmd in family(dev.pid).values()),
        dev,
        log,
        120,
    )
    ports = [ui_port]
    for lane in ("cpu", "gpu"):
        url = yaml.safe_load((project.data_dir / "run" / f"{lane}-lane.json").read_text())["url"]
        ports.append(int(url.rsplit(":", 1)[1]))
    code, tree = _stop_and_check(dev, signal.SIGTERM, log, ports, within_s=120)
    assert code == 0, log.read_text()[-3000:]
    commands = " ".join(tree.values())
    for started in (
        "llama-server",
        "vllm.entrypoints",
        "dagster dev",
        "dagster_webserver",
        "dagster._daemon",
    ):
        assert started in commands, f"{started} was not running: {tree}"

"""`lanes service install|status|uninstall` on real folders, where systemd is not running; and the lane
units' publish step, which makes a lane a unit started findable by the daemon's runs."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from lanes_pipeline.cli import main
from lanes_pipeline.deploy.service_units import COMPOSE_FILE, DAEMON, TARGET
from lanes_pipeline.embedded.servers import running_embedded_url, state_file
from lanes_pipeline_tests.core.processes import family, free_port, survivors

# The module, not the click group that lanes_pipeline.cli exports under the same name.
service_cli = importlib.import_module("lanes_pipeline.cli.service")

UNITS = {
    "lanes-cpu-lane.service",
    "lanes-gpu-lane.service",
    "lanes-dagster-daemon.service",
    "lanes-dagster-webserver.service",
    TARGET,
}


def _lanes(*args: str) -> str:
    result = CliRunner().invoke(main, ["service", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def no_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """systemd's user folder in tmp, and no systemctl on PATH: a machine where systemd is not running."""
    folder = tmp_path / "systemd-user"
    monkeypatch.setitem(service_cli.SYSTEMD_DIRS, "user", folder)
    bare = tmp_path / "bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    return folder


def test_install_status_uninstall_without_systemd(no_systemd: Path) -> None:
    folder = no_systemd
    folder.mkdir()
    (folder / "mine.service").write_text("[Service]\nExecStart=/bin/true\n")  # the user's own unit

    out = _lanes("install")
    assert {path.name for path in folder.iterdir()} == {*UNITS, "mine.service", service_cli.MANIFEST}
    assert "systemd is not running here" in out
    assert f"systemctl --user daemon-reload && systemctl --user enable --now {TARGET}" in out

    status = _lanes("status").splitlines()
    assert sorted(status) == sorted(f"{name}: installed, systemd unavailable" for name in UNITS)

    _lanes("install")  # again: its own files are rewritten, not refused
    out = _lanes("uninstall")
    assert {path.name for path in folder.iterdir()} == {"mine.service"}  # exactly what install wrote
    assert out.count("removed ") == len(UNITS)
    assert _lanes("status") == f"not installed in {folder}\n"


def test_install_never_overwrites_a_file_it_did_not_write(no_systemd: Path) -> None:
    no_systemd.mkdir()
    theirs = no_systemd / DAEMON
    theirs.write_text("their own daemon unit\n")
    result = CliRunner().invoke(main, ["service", "install"])
    assert result.exit_code == 1
    assert f"already has {DAEMON}, not written by `lanes service install`" in result.output
    assert theirs.read_text() == "their own daemon unit\n"
    assert not (no_systemd / service_cli.MANIFEST).exists()
    result = CliRunner().invoke(main, ["service", "uninstall"])
    assert result.exit_code == 1 and "nothing to remove" in result.output
    assert theirs.exists()


def test_dir_and_compose(tmp_path: Path, no_systemd: Path) -> None:
    review = tmp_path / "review"
    out = _lanes("install", "--dir", str(review))
    assert {path.name for path in review.iterdir()} == {*UNITS, service_cli.MANIFEST}
    assert "not in a systemd folder" in out and not no_systemd.exists()
    assert "(not in a systemd folder)" in _lanes("status", "--dir", str(review))
    _lanes("uninstall", "--dir", str(review))
    assert list(review.iterdir()) == []

    out = _lanes("install", "--compose", "--dir", str(review))
    assert "LANES_IMAGE=<your image> docker compose" in out
    compose = yaml.safe_load((review / COMPOSE_FILE).read_text())
    assert "lanes-dagster-daemon" in compose["services"]
    manifest = json.loads((review / service_cli.MANIFEST).read_text())
    assert manifest == {"mode": "user", "compose": True, "files": [COMPOSE_FILE]}
    _lanes("uninstall", "--dir", str(review))
    assert list(review.iterdir()) == []


def test_publish_makes_a_lane_findable_and_unpublish_forgets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lane unit's ExecStartPost waits until its server answers, then writes the state file that runs
    read (running_embedded_url); ExecStopPost removes it. A plain HTTP server stands in for llama-server."""
    data, site = tmp_path / "data", tmp_path / "site"
    site.mkdir()
    (site / "health").write_text("ok")
    monkeypatch.setenv("LANES_DATA_DIR", str(data))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # no --pid (compose's post_start): the port's listener is published
        _lanes("publish", "cpu", "--url", url, "--ready-path", "/health", "--timeout", "30")
        assert json.loads(state_file(data, "cpu").read_text()) == {"url": url, "pid": server.pid}
        assert running_embedded_url(data, "cpu") == url
        _lanes("unpublish", "cpu")
        assert running_embedded_url(data, "cpu") is None and not state_file(data, "cpu").exists()
    finally:
        server.kill()
        server.wait()
    result = CliRunner().invoke(
        main, ["service", "publish", "gpu", "--url", url, "--ready-path", "/v1/models", "--timeout", "1"]
    )
    assert result.exit_code == 1 and f"{url}/v1/models did not answer 200 within 1 s" in result.output
    assert not state_file(data, "gpu").exists()


def test_service_run_stops_its_unit_on_sigterm(tmp_path: Path) -> None:
    """`lanes service run UNIT` (where systemd is not running) stops the unit and all it started on SIGTERM
    (what `docker stop` or `kill` send)."""
    unit = tmp_path / "sleeper.service"
    unit.write_text(
        "[Service]\n"
        f"WorkingDirectory={tmp_path}\n"
        'ExecStart=/bin/sh -c "sleep 300 & sleep 300; wait"\n'
        "Restart=on-failure\n"
        "TimeoutStopSec=10\n"
    )
    command = [sys.executable, "-m", "lanes_pipeline.cli", "service", "run", str(unit)]
    runner = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while len(family(runner.pid)) < 4 and time.monotonic() < deadline:  # runner, sh, two sleeps
            time.sleep(0.2)
        tree = family(runner.pid)
        assert len(tree) == 4, tree
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=30)
    finally:
        runner.kill()
    assert runner.returncode == 0, out
    assert b"sleeper.service: stopped (exit -15)" in out
    assert survivors(tree) == {}

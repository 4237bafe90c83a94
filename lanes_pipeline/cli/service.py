"""`lanes service install|uninstall|status|run`: the Dagster daemon, the Dagster UI and each embedded lane as
services that stay up without a terminal (systemd units, or a docker compose file), rendered by
deploy/service_units.py. `prepare`, `publish` and `unpublish` are the steps those units run themselves.

Only the I/O lives here: asking the lanes' command builders for their servers, writing the files and a
manifest of them (uninstall removes exactly those), and calling systemctl where it works.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import httpx
import psutil
from pydantic import BaseModel, ConfigDict, ValidationError

from lanes_pipeline.cli.stopping import stop_like_ctrl_c
from lanes_pipeline.deploy.instance import prepare_instance, use_project_instance
from lanes_pipeline.deploy.service_units import (
    COMPOSE_FILE,
    TARGET,
    LaneServer,
    Mode,
    ServiceSpec,
    parse_unit,
    render_compose,
    render_systemd,
)
from lanes_pipeline.deploy.supervisor import Supervisor, SupervisorError
from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import (
    LaneName,
    llama_server_command,
    state_file,
    vllm_server_command,
)
from lanes_pipeline.errors import LaneError
from lanes_pipeline.settings import (
    ConfigError,
    ConfigIssue,
    CpuLane,
    GpuLane,
    Settings,
    data_dir,
    load_settings,
)

MANIFEST = ".lanes-pipeline-manifest.json"
SYSTEMD_DIRS: dict[Mode, Path] = {
    "user": Path.home() / ".config" / "systemd" / "user",
    "system": Path("/etc/systemd/system"),
}


class Manifest(BaseModel):
    """What `install` wrote into a folder: `uninstall` removes these files and nothing else."""

    model_config = ConfigDict(extra="forbid")
    mode: Mode
    compose: bool
    files: list[str]


def lane_server(settings: Settings, lane: LaneName) -> LaneServer:
    """The lane's server exactly as `lanes serve` / `lanes dev` start it (the same command builder), on its
    configured port. A service needs a fixed port and no key in a world-readable unit file."""
    config: CpuLane | GpuLane = settings.lanes.cpu_lane if lane == "cpu" else settings.lanes.gpu_lane
    key = f"{lane}_lane"
    if config.embedded.port == 0:
        reason = "is 0 (a free port at each start); a service needs a fixed port for the daemon's runs"
        raise ConfigError([ConfigIssue("lanes.yaml", f"{key}.embedded.port", reason)])
    if config.api_key_env:
        reason = (
            "is set: `lanes service` would write the key into the unit file; run an embedded lane with a key "
            "yourself (`lanes serve`), or set base_url to your own server"
        )
        raise ConfigError([ConfigIssue("lanes.yaml", f"{key}.api_key_env", reason)])
    data = settings.data_dir
    if isinstance(config, CpuLane):
        command = llama_server_command(config, data, config.embedded.port)
    else:
        command = vllm_server_command(config, data, config.embedded.port)
    return LaneServer(
        lane=lane,
        argv=command.argv,
        env=command.env,
        port=command.port,
        ready_path=command.ready_path,
        ready_timeout_s=config.ready_timeout_s,
        log_dir=data / "logs",  # EmbeddedServer's working directory (ik writes llama.log there)
    )


def gather_spec(
    settings: Settings, mode: Mode, host: str, port: int, dagster_home: Path | None
) -> ServiceSpec:
    """Everything the units need, from the configs and this environment (the same folders as `make dev`)."""
    home = dagster_home or Path(os.environ.get("DAGSTER_HOME") or settings.data_dir / "dagster_home")
    lanes: list[LaneName] = [
        lane
        for lane, config in (("cpu", settings.lanes.cpu_lane), ("gpu", settings.lanes.gpu_lane))
        if config.is_embedded
    ]
    return ServiceSpec(
        mode=mode,
        project_root=settings.project_root.absolute(),
        config_dir=settings.config_dir.absolute(),
        data_dir=settings.data_dir.absolute(),
        dagster_home=home.absolute(),
        python=Path(sys.executable).absolute(),  # not resolved: the venv's own interpreter
        lanes=[lane_server(settings, lane) for lane in lanes],
        webserver_host=host,
        webserver_port=port,
        user=getpass.getuser() if mode == "system" and os.geteuid() != 0 else None,
        owner=f"{os.getuid()}:{os.getgid()}",
        engines_dir=engines.engines_dir().absolute(),
    )


def _systemctl(mode: Mode, *args: str) -> subprocess.CompletedProcess[str] | None:
    """systemctl's answer, or None where systemd is not running (no manager to talk to)."""
    command = ["systemctl", *(["--user"] if mode == "user" else []), *args]
    try:
        probe = subprocess.run([*command[: -len(args)], "show", "--property=Version"], capture_output=True)
    except FileNotFoundError:
        return None
    if probe.returncode != 0:
        return None
    return subprocess.run(command, capture_output=True, text=True)


def _systemctl_hint(mode: Mode) -> str:
    flag = " --user" if mode == "user" else ""
    return f"systemctl{flag} daemon-reload && systemctl{flag} enable --now {TARGET}"


def _read_manifest(folder: Path) -> Manifest | None:
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        return Manifest.model_validate_json(path.read_text())
    except (ValidationError, OSError) as exc:
        raise click.ClickException(f"{path} is not a manifest `lanes service install` wrote: {exc}") from None


_MODE = click.option("--system", "system", is_flag=True, help="system units in /etc/systemd/system (root)")
_DIR = click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="write/read the files here instead (for review or tests; systemctl is not called)",
)


@click.group()
def service() -> None:
    """Run the daemon, the UI and the embedded lanes as services (systemd units or docker compose)."""


@service.command()
@_MODE
@_DIR
@click.option("--compose", is_flag=True, help=f"write a docker compose file ({COMPOSE_FILE}) instead")
@click.option("--host", default="127.0.0.1", show_default=True, help="address of the Dagster UI")
@click.option("--port", default=3000, show_default=True, help="port of the Dagster UI")
@click.option("--now", is_flag=True, help="also enable and start the target (where systemd runs)")
def install(system: bool, folder: Path | None, compose: bool, host: str, port: int, now: bool) -> None:
    """Write the units (and a manifest of them); reload systemd where it runs."""
    mode: Mode = "system" if system else "user"
    try:
        spec = gather_spec(load_settings(), mode, host, port, None)
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None
    files = {COMPOSE_FILE: render_compose(spec)} if compose else render_systemd(spec)
    for server in spec.lanes:  # a lane's working directory: systemd will not start a unit without it
        server.log_dir.mkdir(parents=True, exist_ok=True)
    target = folder or (Path.cwd() if compose else SYSTEMD_DIRS[mode])
    try:
        _write(target, files, Manifest(mode=mode, compose=compose, files=sorted(files)))
    except OSError as exc:  # /etc/systemd/system without root, a read-only folder...
        raise click.ClickException(f"cannot write the units into {target}: {exc}") from None
    for name in sorted(files):
        click.echo(f"wrote {target / name}")
    if compose:
        click.echo(f"start: LANES_IMAGE=<your image> docker compose -f {target / COMPOSE_FILE} up -d")
        return
    if folder is not None:
        click.echo(
            f"not in a systemd folder: copy them to {SYSTEMD_DIRS[mode]}, then {_systemctl_hint(mode)}"
        )
        return
    reload = _systemctl(mode, "daemon-reload")
    if reload is None:
        click.echo(
            f"systemd is not running here (PID 1 is not systemd); where it runs: {_systemctl_hint(mode)}"
        )
        return
    if reload.returncode != 0:
        raise click.ClickException(f"systemctl daemon-reload failed: {reload.stderr.strip()}")
    if now:
        started = _systemctl(mode, "enable", "--now", TARGET)
        if started is None or started.returncode != 0:
            raise click.ClickException(
                f"systemctl enable --now {TARGET} failed: {started and started.stderr}"
            )
        click.echo(f"enabled and started {TARGET}")
    else:
        click.echo(f"start them: {_systemctl_hint(mode)}")


def _write(target: Path, files: dict[str, str], manifest: Manifest) -> None:
    """Write the files; a file of that name that an earlier install did not write is never overwritten."""
    earlier = _read_manifest(target)
    ours = set(earlier.files) if earlier else set()
    foreign = [name for name in files if (target / name).exists() and name not in ours]
    if foreign:
        raise click.ClickException(
            f"{target} already has {', '.join(foreign)}, not written by `lanes service install`: left as is"
        )
    target.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (target / name).write_text(text)
    # A re-install keeps listing what an earlier one wrote and this one did not rewrite: uninstall takes both.
    kept = sorted(ours - set(files))
    manifest = manifest.model_copy(update={"files": sorted({*manifest.files, *kept})})
    (target / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")


def _folder(system: bool, folder: Path | None) -> tuple[Mode, Path]:
    mode: Mode = "system" if system else "user"
    return mode, folder or SYSTEMD_DIRS[mode]


@service.command()
@_MODE
@_DIR
def uninstall(system: bool, folder: Path | None) -> None:
    """Stop and remove exactly the files `install` wrote (its manifest says which)."""
    mode, target = _folder(system, folder)
    manifest = _read_manifest(target)
    if manifest is None:
        raise click.ClickException(
            f"nothing to remove: {target} has no {MANIFEST} from `lanes service install`"
        )
    systemd = not manifest.compose and folder is None
    if systemd and TARGET in manifest.files:
        _systemctl(mode, "disable", "--now", TARGET)  # where systemd runs; nothing to stop elsewhere
    for name in manifest.files:
        (target / name).unlink(missing_ok=True)
        click.echo(f"removed {target / name}")
    (target / MANIFEST).unlink()
    if systemd:
        _systemctl(mode, "daemon-reload")


@service.command()
@_MODE
@_DIR
def status(system: bool, folder: Path | None) -> None:
    """For each unit: installed or not, and active or not where systemd runs."""
    mode, target = _folder(system, folder)
    manifest = _read_manifest(target)
    if manifest is None:
        click.echo(f"not installed in {target}")
        return
    for name in manifest.files:
        installed = "installed" if (target / name).exists() else "missing"
        if manifest.compose or name == COMPOSE_FILE:
            click.echo(f"{name}: {installed} (compose: ask `docker compose ps`)")
            continue
        if folder is not None:
            click.echo(f"{name}: {installed} (not in a systemd folder)")
            continue
        answer = _systemctl(mode, "is-active", name)
        # is-active prints active, inactive, failed, activating...; its exit code only says "not active"
        active = (answer.stdout.strip() or "unknown") if answer is not None else "systemd unavailable"
        click.echo(f"{name}: {installed}, {active}")


@service.command()
@click.argument("unit_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def run(unit_file: Path) -> None:
    """Run one unit file with the plain supervisor (where systemd is not running) until Ctrl-C/SIGTERM."""
    stop_like_ctrl_c()
    try:
        unit = parse_unit(unit_file.read_text(), unit_file.name)
    except (ValueError, ValidationError) as exc:
        raise click.ClickException(f"{unit_file}: {exc}") from None
    supervisor = Supervisor(unit)
    try:
        supervisor.start()
        click.echo(f"{unit.name}: running (pid {supervisor.pid}); Ctrl-C stops it", err=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    except SupervisorError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        code = supervisor.stop()
        click.echo(f"{unit.name}: stopped (exit {code})", err=True)


@service.command(hidden=True)
def prepare() -> None:
    """The daemon unit's ExecStartPre, as `lanes dev` does: instance folder, pool limits, dead runs' slots."""
    try:
        settings = load_settings()
        home = use_project_instance(settings)
        _instance, limits, released = prepare_instance(settings)
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None
    pools = ", ".join(f"{pool} {limit}" for pool, limit in sorted(limits.items()))
    click.echo(f"DAGSTER_HOME: {home}; pool limits: {pools}; dead runs' slots freed: {len(released)}")


@service.command(hidden=True)
@click.argument("lane", type=click.Choice(["cpu", "gpu"]))
@click.option("--url", required=True)
@click.option("--ready-path", required=True)
@click.option("--timeout", "timeout_s", type=float, required=True)
@click.option("--pid", type=int, default=None, help="the server's pid (default: the port's listener)")
def publish(lane: LaneName, url: str, ready_path: str, timeout_s: float, pid: int | None) -> None:
    """A lane unit's ExecStartPost: wait until the server answers, then publish it for the daemon's runs."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url + ready_path, timeout=5.0)
            if answer.status_code == 200:
                break
            last = f"HTTP {answer.status_code}"
        except httpx.TransportError as exc:
            last = type(exc).__name__
        time.sleep(0.5)
    else:
        raise click.ClickException(f"{url}{ready_path} did not answer 200 within {timeout_s:g} s ({last})")
    pid = pid or _listener(int(url.rsplit(":", 1)[1]))
    path = state_file(data_dir(), lane)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"url": url, "pid": pid}))  # the format EmbeddedServer.start publishes
    click.echo(f"{lane}_lane: {url} published in {path}")


def _listener(port: int) -> int:
    for conn in psutil.net_connections(kind="inet"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return conn.pid
    raise click.ClickException(f"no process listens on port {port}")


@service.command(hidden=True)
@click.argument("lane", type=click.Choice(["cpu", "gpu"]))
def unpublish(lane: LaneName) -> None:
    """A lane unit's ExecStopPost: the daemon's runs no longer find a stopped server."""
    state_file(data_dir(), lane).unlink(missing_ok=True)

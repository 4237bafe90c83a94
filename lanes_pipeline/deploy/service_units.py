"""`lanes service`: the daemon, the webserver and each embedded lane as systemd units or a compose file.

Rendering is pure: a `ServiceSpec` (gathered once by `cli/service.py`, which asks the lanes' own command
builders for their servers' command lines) becomes `Unit` models, and those become unit texts or a compose
file. `parse_unit` reads a unit text back into the same model, for the plain supervisor that runs a unit
where systemd is not running (deploy/supervisor.py).

Runs launched by the daemon find an embedded lane through its published state file (`<data>/run/<lane>.json`,
embedded/servers.py); a lane unit runs the server itself, so it publishes that file once the server answers
(ExecStartPost, `lanes service publish`) and removes it when the server stops (ExecStopPost). Without it a run
would try to start a second server on the lane's port. The daemon's ExecStartPre does what `lanes dev` does
before starting Dagster: pool limits from the configs, slots of dead runs freed (`lanes service prepare`).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.config.models import LaneName

Mode = Literal["user", "system"]
TARGET = "lanes-pipeline.target"
COMPOSE_FILE = "lanes-pipeline.compose.yaml"
DAEMON, WEBSERVER = "lanes-dagster-daemon.service", "lanes-dagster-webserver.service"
# systemd's own default; a lane's server may need minutes to load its model, set per lane below.
STOP_TIMEOUT_S = 90


def lane_unit_name(lane: str) -> str:
    return f"lanes-{lane}-lane.service"


class LaneServer(BaseModel):
    """An embedded lane's server as its command builder made it (embedded/servers.py ServerCommand)."""

    model_config = ConfigDict(extra="forbid")
    lane: LaneName
    argv: list[str]
    env: dict[str, str]
    port: int
    ready_path: str
    ready_timeout_s: float
    log_dir: (
        Path  # where `lanes serve` runs it: ik's llama-server writes llama.log into its working directory
    )


class ServiceSpec(BaseModel):
    """Everything the units are made from; the same config, data and instance folders as `make dev`."""

    model_config = ConfigDict(extra="forbid")
    mode: Mode
    project_root: Path
    config_dir: Path
    data_dir: Path
    dagster_home: Path
    python: Path  # the project's interpreter (.venv/bin/python); dagster's scripts lie beside it
    lanes: list[LaneServer]
    webserver_host: str = "127.0.0.1"
    webserver_port: int = 3000
    user: str | None = None  # system units run as this user
    owner: str  # "uid:gid" the compose services run as, so what they write in the data folder is the user's
    engines_dir: Path  # the embedded engines and models outside the project (engines.engines_dir())


class Unit(BaseModel):
    """One systemd service unit: what the unit text says, declared once (rendered and parsed back)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    description: str
    exec_start: list[str]
    exec_start_pre: list[list[str]] = Field(default_factory=list)
    exec_start_post: list[list[str]] = Field(default_factory=list)
    exec_stop_post: list[list[str]] = Field(default_factory=list)
    environment: dict[str, str]
    working_directory: Path
    restart: Literal["no", "on-failure", "always"] = "on-failure"
    restart_sec: float = 5.0
    timeout_start_s: int = STOP_TIMEOUT_S
    timeout_stop_s: int = STOP_TIMEOUT_S
    after: list[str] = Field(default_factory=list)
    wants: list[str] = Field(default_factory=list)
    user: str | None = None


def _lanes_cli(spec: ServiceSpec, *args: str) -> list[str]:
    return [str(spec.python), "-m", "lanes_pipeline.cli", "service", *args]


def _environment(spec: ServiceSpec) -> dict[str, str]:
    return {
        "LANES_CONFIG_DIR": str(spec.config_dir),
        "LANES_DATA_DIR": str(spec.data_dir),
        "DAGSTER_HOME": str(spec.dagster_home),
        "PYTHONUNBUFFERED": "1",  # the journal gets each line as it is written
    }


def _publish(spec: ServiceSpec, server: LaneServer, with_pid: bool) -> list[str]:
    """Wait until the lane answers, then publish it for the daemon's runs. systemd gives the server's pid;
    elsewhere `publish` takes the port's listener."""
    publish = _lanes_cli(
        spec,
        "publish",
        server.lane,
        "--url",
        f"http://127.0.0.1:{server.port}",
        "--ready-path",
        server.ready_path,
        "--timeout",
        f"{server.ready_timeout_s:g}",
    )
    return [*publish, "--pid", "$MAINPID"] if with_pid else publish


def lane_unit(spec: ServiceSpec, server: LaneServer) -> Unit:
    url = f"http://127.0.0.1:{server.port}"
    timeout = int(server.ready_timeout_s) + 30
    return Unit(
        name=lane_unit_name(server.lane),
        description=f"lanes_pipeline: the embedded {server.lane.upper()} lane's server on {url}",
        exec_start=server.argv,
        exec_start_post=[_publish(spec, server, with_pid=True)],
        exec_stop_post=[_lanes_cli(spec, "unpublish", server.lane)],
        environment={**_environment(spec), **server.env},
        working_directory=server.log_dir,
        timeout_start_s=timeout,
        user=spec.user,
    )


def daemon_unit(spec: ServiceSpec) -> Unit:
    lanes = [lane_unit_name(server.lane) for server in spec.lanes]
    return Unit(
        name=DAEMON,
        description="lanes_pipeline: the Dagster daemon (schedule, backfills, run queue, run monitoring)",
        exec_start=[str(spec.python.parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
        exec_start_pre=[_lanes_cli(spec, "prepare")],
        environment=_environment(spec),
        working_directory=spec.project_root,
        after=lanes,
        wants=lanes,
        user=spec.user,
    )


def webserver_unit(spec: ServiceSpec) -> Unit:
    listen = ["-h", spec.webserver_host, "-p", str(spec.webserver_port)]
    return Unit(
        name=WEBSERVER,
        description=f"lanes_pipeline: the Dagster UI on http://{spec.webserver_host}:{spec.webserver_port}",
        exec_start=[str(spec.python.parent / "dagster-webserver"), "-w", "workspace.yaml", *listen],
        environment=_environment(spec),
        working_directory=spec.project_root,
        after=[DAEMON],
        user=spec.user,
    )


def render_units(spec: ServiceSpec) -> list[Unit]:
    """The lanes first (the daemon is ordered after them), then the daemon and the webserver."""
    return [*(lane_unit(spec, server) for server in spec.lanes), daemon_unit(spec), webserver_unit(spec)]


# systemd command lines: `%` starts a specifier and `$` a variable, each doubled to mean itself; a word with
# blanks, quotes or backslashes is double-quoted with C escapes. $MAINPID is the one variable we mean.
_VARIABLE = re.compile(r"\$\$|\$\{(\w+)\}|\$(\w+)")
_NEEDS_QUOTES = re.compile(r"[\s\"'\\;]")


def _word(text: str) -> str:
    text = text.replace("%", "%%")
    if text != "$MAINPID":
        text = text.replace("$", "$$")
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _command(argv: list[str]) -> str:
    return " ".join(_word(arg) for arg in argv)


def unit_text(unit: Unit) -> str:
    lines = ["# Written by `lanes service install`; `lanes service uninstall` removes it.", "[Unit]"]
    lines.append(f"Description={unit.description}")
    lines += [f"Wants={name}" for name in unit.wants]
    lines += [f"After={name}" for name in unit.after]
    lines.append(f"PartOf={TARGET}")  # stopping or restarting the target reaches every unit
    lines += ["", "[Service]", "Type=simple"]
    if unit.user:
        lines.append(f"User={unit.user}")
    lines.append(f"WorkingDirectory={_word(str(unit.working_directory))}")
    lines += [f"Environment={_word(f'{key}={value}')}" for key, value in sorted(unit.environment.items())]
    lines += [f"ExecStartPre={_command(argv)}" for argv in unit.exec_start_pre]
    lines.append(f"ExecStart={_command(unit.exec_start)}")
    lines += [f"ExecStartPost={_command(argv)}" for argv in unit.exec_start_post]
    lines += [f"ExecStopPost={_command(argv)}" for argv in unit.exec_stop_post]
    lines += [
        f"Restart={unit.restart}",
        f"RestartSec={unit.restart_sec:g}",
        f"TimeoutStartSec={unit.timeout_start_s}",
        f"TimeoutStopSec={unit.timeout_stop_s}",
        "KillMode=control-group",  # what a server forked (vLLM's engine core, code servers) stops with it
        "",
        "[Install]",
        f"WantedBy={TARGET}",
    ]
    return "\n".join(lines) + "\n"


def target_text(units: list[Unit], mode: Mode) -> str:
    names = " ".join(unit.name for unit in units)
    default = "default.target" if mode == "user" else "multi-user.target"
    return (
        "# Written by `lanes service install`; `lanes service uninstall` removes it.\n"
        "[Unit]\nDescription=lanes_pipeline: the lanes, the Dagster daemon and the Dagster UI\n"
        f"Wants={names}\n\n[Install]\nWantedBy={default}\n"
    )


def render_systemd(spec: ServiceSpec) -> dict[str, str]:
    """File name -> text of every unit file, the target included."""
    units = render_units(spec)
    files = {unit.name: unit_text(unit) for unit in units}
    files[TARGET] = target_text(units, spec.mode)
    return files


def expand_word(word: str, variables: dict[str, str]) -> str:
    """One word of a unit text as systemd reads it: `$$` and `%%` mean themselves, ${X} / $X come from
    `variables` (an unknown one is empty, as in systemd)."""

    def variable(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return variables.get(match.group(1) or match.group(2), "")

    return _VARIABLE.sub(variable, word).replace("%%", "%")


def parse_command(line: str, variables: dict[str, str] | None = None) -> list[str]:
    """An Exec*= value as argv, variables such as $MAINPID replaced from `variables`."""
    return [expand_word(word, variables or {}) for word in shlex.split(line)]


def parse_unit(text: str, name: str) -> Unit:
    """A unit text as `unit_text` writes it, read back (the keys the supervisor needs; $MAINPID is kept)."""
    keep = {"MAINPID": "$MAINPID"}
    values: dict[str, list[str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{name} line {number}: expected Key=value, got {raw!r}")
        values.setdefault(key.strip(), []).append(value.strip())

    def one(key: str, default: str | None = None) -> str:
        found = values.get(key)
        if not found:
            if default is None:
                raise ValueError(f"{name}: no {key}= line")
            return default
        return found[-1]

    environment = {}
    for value in values.get("Environment", []):
        for word in shlex.split(value):
            key, _, val = expand_word(word, keep).partition("=")
            environment[key] = val
    return Unit(
        name=name,
        description=one("Description", ""),
        exec_start=parse_command(one("ExecStart"), keep),
        exec_start_pre=[parse_command(line, keep) for line in values.get("ExecStartPre", [])],
        exec_start_post=[parse_command(line, keep) for line in values.get("ExecStartPost", [])],
        exec_stop_post=[parse_command(line, keep) for line in values.get("ExecStopPost", [])],
        environment=environment,
        working_directory=Path(expand_word(shlex.split(one("WorkingDirectory"))[0], keep)),
        restart=one("Restart", "no"),  # pydantic checks it is one of the three
        restart_sec=float(one("RestartSec", "0.1")),
        timeout_start_s=int(one("TimeoutStartSec", str(STOP_TIMEOUT_S))),
        timeout_stop_s=int(one("TimeoutStopSec", str(STOP_TIMEOUT_S))),
        after=values.get("After", []),
        wants=values.get("Wants", []),
        user=values.get("User", [None])[-1],
    )


def render_compose(spec: ServiceSpec) -> str:
    """The same services as a docker compose file. The image is the user's: one with this project's Python
    and system libraries; the project, data, config and engine folders are mounted at their host paths, so
    every path in the commands holds. Host network and PID namespace: the lanes listen on 127.0.0.1 and the
    daemon's runs check a published lane's pid."""
    units = render_units(spec)
    mounts = sorted(
        {str(path) for path in (spec.project_root, spec.data_dir, spec.config_dir, spec.engines_dir)}
    )
    common = {
        "image": "${LANES_IMAGE:?set LANES_IMAGE: an image with this project's Python (docs/operations.md)}",
        "network_mode": "host",
        "pid": "host",
        "restart": "on-failure",
        "volumes": [f"{path}:{path}" for path in mounts],
        "user": spec.owner,
    }
    services: dict[str, dict[str, object]] = {}
    prepare = daemon_unit(spec).exec_start_pre[0]
    services["lanes-prepare"] = {
        **common,
        "restart": "no",
        "command": prepare,
        "environment": _environment(spec),
        "working_dir": str(spec.project_root),
    }
    servers = {lane_unit_name(server.lane): server for server in spec.lanes}
    for unit in units:
        service: dict[str, object] = {
            **common,
            "command": unit.exec_start,
            "environment": unit.environment,
            "working_dir": str(unit.working_directory),
        }
        if unit.name in servers:  # a lane: published once it answers, unpublished when it stops
            service["post_start"] = [{"command": _publish(spec, servers[unit.name], with_pid=False)}]
            service["pre_stop"] = [{"command": unit.exec_stop_post[0]}]
        else:
            depends = {"lanes-prepare": {"condition": "service_completed_successfully"}}
            depends |= {name.removesuffix(".service"): {"condition": "service_started"} for name in servers}
            service["depends_on"] = depends
        services[unit.name.removesuffix(".service")] = service
    header = (
        "# Written by `lanes service install --compose`; `lanes service uninstall` removes it.\n"
        "# LANES_IMAGE=<your image> docker compose -f lanes-pipeline.compose.yaml up -d  (Compose >= 2.30)\n"
    )
    return header + yaml.safe_dump({"name": "lanes-pipeline", "services": services}, sort_keys=False)

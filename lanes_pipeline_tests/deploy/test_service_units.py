"""`lanes service` rendering: the units for the shipped configs run the exact commands the project runs, with
the folders `make dev` uses; unit texts read back into the same model; the compose file has the same
services; configs a service cannot run are refused with the file and key."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import yaml

from lanes_pipeline.cli.service import gather_spec
from lanes_pipeline.deploy.service_units import (
    DAEMON,
    TARGET,
    WEBSERVER,
    ServiceSpec,
    Unit,
    lane_unit_name,
    parse_unit,
    render_compose,
    render_systemd,
    render_units,
    unit_text,
)
from lanes_pipeline.embedded.servers import llama_server_command, vllm_server_command
from lanes_pipeline.settings import ConfigError, Settings


@pytest.fixture
def spec(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> ServiceSpec:
    monkeypatch.delenv("DAGSTER_HOME", raising=False)  # as `make dev` sees it: data/dagster_home
    return gather_spec(settings, "user", "127.0.0.1", 3000, None)


def _units(spec: ServiceSpec) -> dict[str, Unit]:
    """The units as their written texts say: parsed back, so the checks read what systemd would read."""
    return {name: parse_unit(text, name) for name, text in render_systemd(spec).items() if name != TARGET}


def test_units_run_the_projects_own_commands(settings: Settings, spec: ServiceSpec) -> None:
    units = _units(spec)
    cpu, gpu = settings.lanes.cpu_lane, settings.lanes.gpu_lane
    assert cpu.is_embedded and gpu.is_embedded, "the shipped configs embed both lanes"
    assert set(units) == {lane_unit_name("cpu"), lane_unit_name("gpu"), DAEMON, WEBSERVER}

    # Each lane: the command `lanes serve` / `lanes dev` start (the same builder), on its configured port.
    for lane, command in (
        ("cpu", llama_server_command(cpu, settings.data_dir, cpu.embedded.port)),
        ("gpu", vllm_server_command(gpu, settings.data_dir, gpu.embedded.port)),
    ):
        unit = units[lane_unit_name(lane)]
        assert unit.exec_start == command.argv
        assert command.env.items() <= unit.environment.items()
        assert unit.working_directory == settings.data_dir / "logs"  # where EmbeddedServer runs it
        url = f"http://127.0.0.1:{command.port}"
        publish = unit.exec_start_post[0]
        assert publish[publish.index("--url") + 1] == url and publish[-2:] == ["--pid", "$MAINPID"]
        assert publish[publish.index("--ready-path") + 1] == command.ready_path
        assert unit.exec_stop_post == [
            [sys.executable, "-m", "lanes_pipeline.cli", "service", "unpublish", lane]
        ]

    # The daemon and the UI: Dagster's own scripts from this venv, on the project's workspace.yaml.
    daemon, web = units[DAEMON], units[WEBSERVER]
    bin_dir = Path(sys.executable).parent
    assert daemon.exec_start == [str(bin_dir / "dagster-daemon"), "run", "-w", "workspace.yaml"]
    listen = ["-h", "127.0.0.1", "-p", "3000"]
    assert web.exec_start == [str(bin_dir / "dagster-webserver"), "-w", "workspace.yaml", *listen]
    for unit in (daemon, web):
        assert os.access(unit.exec_start[0], os.X_OK), unit.exec_start[0]
        assert unit.working_directory == settings.project_root
        assert (unit.working_directory / "workspace.yaml").is_file()
    assert daemon.exec_start_pre == [[sys.executable, "-m", "lanes_pipeline.cli", "service", "prepare"]]
    assert set(daemon.after) == set(daemon.wants) == {lane_unit_name("cpu"), lane_unit_name("gpu")}

    # Every unit: restarted on failure, with make dev's config folder, data folder and instance.
    for unit in units.values():
        assert unit.restart == "on-failure", unit.name
        assert unit.environment["LANES_CONFIG_DIR"] == str(settings.config_dir.absolute())
        assert unit.environment["LANES_DATA_DIR"] == str(settings.data_dir)
        assert unit.environment["DAGSTER_HOME"] == str(settings.project_root / "data" / "dagster_home")
    target = render_systemd(spec)[TARGET]
    assert f"Wants={' '.join(units)}" in target and "WantedBy=default.target" in target


def test_unit_text_reads_back_into_the_same_unit(tmp_path: Path, spec: ServiceSpec) -> None:
    odd = Unit(
        name="odd.service",
        description="odd words",
        exec_start=["/bin/echo", "two words", 'a "quote"', "100%", "$HOME", "back\\slash", "it's", ""],
        exec_start_post=[["/bin/true", "$MAINPID"]],
        environment={"A": "x y", "B": "50%", "C": "$NOT_A_VARIABLE"},
        working_directory=tmp_path / "with space",
    )
    assert parse_unit(unit_text(odd), odd.name) == odd
    for unit in render_units(spec):
        assert parse_unit(unit_text(unit), unit.name) == unit


def test_system_units_go_to_multi_user_target(settings: Settings) -> None:
    spec = gather_spec(settings, "system", "127.0.0.1", 3000, None)
    files = render_systemd(spec)
    assert "WantedBy=multi-user.target" in files[TARGET]
    user = [parse_unit(text, name).user for name, text in files.items() if name != TARGET]
    # root needs no User=; anyone else's system units run as them, not as root
    assert user == [None if os.geteuid() == 0 else spec.user] * 4


def test_compose_file_has_the_same_services(spec: ServiceSpec) -> None:
    compose = yaml.safe_load(render_compose(spec))
    services = compose["services"]
    units = {unit.name.removesuffix(".service"): unit for unit in render_units(spec)}
    assert set(services) == {*units, "lanes-prepare"}
    for name, unit in units.items():
        service = services[name]
        assert service["command"] == unit.exec_start
        assert service["environment"] == unit.environment
        assert service["working_dir"] == str(unit.working_directory)
        assert service["restart"] == "on-failure" and service["network_mode"] == "host"
        assert service["image"].startswith("${LANES_IMAGE:?")  # the user's image, never pulled by us
        assert f"{spec.engines_dir}:{spec.engines_dir}" in service["volumes"]
    assert services["lanes-prepare"]["command"] == units["lanes-dagster-daemon"].exec_start_pre[0]
    assert services["lanes-dagster-daemon"]["depends_on"] == {
        "lanes-prepare": {"condition": "service_completed_successfully"},
        "lanes-cpu-lane": {"condition": "service_started"},
        "lanes-gpu-lane": {"condition": "service_started"},
    }
    publish = services["lanes-cpu-lane"]["post_start"][0]["command"]
    assert "publish" in publish and "$MAINPID" not in publish  # compose has no MAINPID: the port's listener


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"embedded_port": 0}, "cpu_lane.embedded.port"),
        ({"api_key_env": "LANES_TEST_KEY"}, "cpu_lane.api_key_env"),
    ],
)
def test_configs_a_service_cannot_run_are_refused(
    settings: Settings, change: dict[str, object], key: str
) -> None:
    lane = settings.lanes.cpu_lane
    if "embedded_port" in change:
        lane = lane.model_copy(update={"embedded": lane.embedded.model_copy(update={"port": 0})})
    else:
        lane = lane.model_copy(update=change)
    bad = dataclasses.replace(settings, lanes=settings.lanes.model_copy(update={"cpu_lane": lane}))
    with pytest.raises(ConfigError) as caught:
        gather_spec(bad, "user", "127.0.0.1", 3000, None)
    assert f"lanes.yaml: {key}: " in str(caught.value)

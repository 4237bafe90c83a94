"""The embedded lanes are real servers: they start, answer, report bad input clearly, and stop cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from click.testing import CliRunner
from dagster import DagsterInstance, Failure, build_asset_context, build_init_resource_context, materialize

from lanes_pipeline.cli import main
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.definitions import build_definitions
from lanes_pipeline.embedded.servers import (
    EmbeddedServer,
    ServerCommand,
    build_server,
    check_reachable,
    choose_port,
    cpu_flags,
    embedded_dtype,
    vllm_reserved_cpus,
)
from lanes_pipeline.errors import EmbeddedStartError, LaneUnreachableError, PortInUseError
from lanes_pipeline.gpu_lane.resources import GpuLaneResource
from lanes_pipeline.http import OpenAIClient
from lanes_pipeline.loop.lane_probes import cpu_lane_probe, gpu_lane_probe, probe
from lanes_pipeline.settings import CpuLane, EmbeddedCpuServer, GpuLane, Settings, load_settings, project_root
from lanes_pipeline_tests.config_files import read_config, write_config
from lanes_pipeline_tests.core.processes import free_port, port_is_free
from lanes_pipeline_tests.daily.fixtures import daily_project


def test_cpu_lane_answers_with_tokens_per_second(cpu_server: EmbeddedServer, settings: Settings) -> None:
    with OpenAIClient("CPU", cpu_server.url) as client:
        result = probe(client, settings.lanes.cpu_lane.model_alias)
        served = {card.id for card in client.models().data}
    assert settings.lanes.cpu_lane.model_alias in served
    assert result.completion_tokens > 0 and result.generation_tokens_per_s > 0
    assert result.speed_source == "server timings"  # llama-server measures its own speed


def test_gpu_lane_answers_with_tokens_per_second(gpu_server: EmbeddedServer, settings: Settings) -> None:
    with OpenAIClient("GPU", gpu_server.url) as client:
        result = probe(client, settings.lanes.gpu_lane.served_model_name)
        cards = client.models().data
    assert [card.id for card in cards if card.parent is None] == [settings.lanes.gpu_lane.served_model_name]
    assert result.answer and result.generation_tokens_per_s > 0
    argv = gpu_server.command.argv
    assert argv[argv.index("--dtype") + 1] == embedded_dtype(cpu_flags())  # the shipped config: native
    reserved = vllm_reserved_cpus(None, os.cpu_count() or 1)
    if reserved is not None:  # vLLM read it: its thread binding says how many CPUs it kept
        assert f"reserve_cpu_num={reserved}" in gpu_server.log_path.read_text(errors="replace")


def test_the_embedded_vllm_computes_in_float32_unless_the_cpu_has_bfloat16(tmp_path: Path) -> None:
    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n"
    (tmp_path / "avx2").write_text(avx2)
    (tmp_path / "zen4").write_text("processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16\n")
    (tmp_path / "sapphire").write_text("flags\t: avx512f amx_tile amx_bf16\n")
    assert cpu_flags(tmp_path / "avx2") == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert embedded_dtype(cpu_flags(tmp_path / "avx2")) == "float32"
    assert embedded_dtype(cpu_flags(tmp_path / "zen4")) == "bfloat16"
    assert embedded_dtype(cpu_flags(tmp_path / "sapphire")) == "bfloat16"
    assert cpu_flags(tmp_path / "absent") == frozenset()  # no /proc: float32, which every CPU computes
    assert embedded_dtype(frozenset()) == "float32"


def test_the_embedded_vllm_keeps_no_cpu_for_its_engine_loop_on_two_cpus() -> None:
    assert vllm_reserved_cpus(None, 2) == 0  # measured: 1.4-1.8 times the tokens/s on this 2-CPU machine
    assert vllm_reserved_cpus(None, 16) is None  # vLLM's own choice where one CPU is a small share
    assert vllm_reserved_cpus(1, 2) == 1 and vllm_reserved_cpus(0, 16) == 0  # the setting wins


def test_probe_assets_materialize_against_real_lanes(
    cpu_server: EmbeddedServer, gpu_server: EmbeddedServer
) -> None:
    result = materialize(
        [cpu_lane_probe, gpu_lane_probe],
        resources={
            "cpu_lane": CpuLaneResource(config=CpuLane(base_url=cpu_server.url)),
            "gpu_lane": GpuLaneResource(config=GpuLane(base_url=gpu_server.url)),
        },
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    for event in result.get_asset_materialization_events():
        metadata = event.materialization.metadata
        assert metadata["generation_tokens_per_s"].value > 0  # type: ignore[operator]


def test_the_cpu_probe_asks_each_endpoint_and_names_one_that_is_down(cpu_server: EmbeddedServer) -> None:
    """Several CPU-lane servers: each gets the probe and its own figures; one that does not answer is
    named and the probe still materializes; with none answering it fails naming each (called directly:
    through a run, Dagster would retry it per LANE_RETRY for minutes)."""
    dead = f"http://127.0.0.1:{free_port()}"

    def lane(*urls: str) -> CpuLaneResource:
        endpoints = [{"base_url": u, "slots": 1} for u in urls]
        return CpuLaneResource(config=CpuLane(endpoints=endpoints, max_attempts=1))

    resources = {"cpu_lane": lane(dead, cpu_server.url)}
    result = materialize([cpu_lane_probe], resources=resources, instance=DagsterInstance.ephemeral())
    [event] = result.get_asset_materialization_events()
    metadata = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    assert dead in metadata["endpoint_0/down"] and "endpoint_0/generation_tokens_per_s" not in metadata
    assert metadata["endpoint_1/generation_tokens_per_s"] > 0
    assert metadata["generation_tokens_per_s"] == metadata["endpoint_1/generation_tokens_per_s"]
    assert metadata["url"] == cpu_server.url

    with pytest.raises(Failure, match="no CPU-lane endpoint answered the probe") as failed:
        cpu_lane_probe(build_asset_context(), cpu_lane=lane(dead, f"http://127.0.0.1:{free_port()}"))
    assert dead in str(failed.value)


def test_taken_port_is_reported_with_its_owner(settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUseError) as caught:
            build_server(settings, "cpu", port=port, publish=False)
    message = str(caught.value)
    assert f"port {port} for the embedded CPU lane is already in use by pid {os.getpid()}" in message
    assert "cpu_lane.embedded.port in configs/lanes.yaml" in message


def test_unreachable_external_server_names_lane_url_and_what_was_tried() -> None:
    with socket.socket() as probe_socket:  # a port nobody listens on
        probe_socket.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe_socket.getsockname()[1]}"
    with pytest.raises(LaneUnreachableError) as caught:
        check_reachable("gpu", url, None, timeout_s=2)
    message = str(caught.value)
    assert message.startswith(f"GPU lane at {url} is unreachable: GET {url}/v1/models failed: ConnectError")
    assert "gpu_lane.base_url in configs/lanes.yaml" in message


def test_failed_start_shows_log_tail_and_log_path(cpu_server: EmbeddedServer, tmp_path: Path) -> None:
    port = choose_port("cpu", 0)
    argv = [str(port) if arg == str(cpu_server.command.port) else arg for arg in cpu_server.command.argv]
    broken = ServerCommand(
        lane="cpu",
        argv=[*argv, "--no-such-flag"],
        env=cpu_server.command.env,
        port=port,
        ready_path="/health",
    )
    server = EmbeddedServer(broken, tmp_path, ready_timeout_s=60, publish=False)
    with pytest.raises(EmbeddedStartError) as caught:
        server.start()
    message = str(caught.value)
    assert "the embedded CPU lane server exited with code" in message
    assert f"full log: {tmp_path / 'logs' / f'cpu-lane-server-{port}.log'}" in message
    assert "--no-such-flag" in message  # the server's own complaint, from the log tail


@pytest.mark.usefixtures("cpu_engine")
def test_embedded_lane_resource_starts_the_server_its_own_config_describes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing published, a resource's `embedded` lane is started from the resource's own lane config
    (its port and served name here), not from the configs of the default folder read again."""
    monkeypatch.setenv("LANES_DATA_DIR", str(tmp_path / "data"))  # no server published there
    port = choose_port("cpu", 0)
    config = CpuLane(model_alias="resource-alias", embedded=EmbeddedCpuServer(port=port, parallel=1))
    resource = CpuLaneResource(config=config)
    try:
        assert resource.url == f"http://127.0.0.1:{port}"
        with OpenAIClient("CPU", resource.url) as client:
            assert "resource-alias" in {card.id for card in client.models().data}
        assert (tmp_path / "data" / "run" / "cpu-lane.json").exists()  # published for other processes
    finally:
        resource.teardown_after_execution(build_init_resource_context())
    assert not (tmp_path / "data" / "run" / "cpu-lane.json").exists()
    assert port_is_free(port)


def test_lanes_serve_stops_every_process_on_sigterm(tmp_path: Path) -> None:
    """`lanes serve cpu` as a user runs it: URL on stdout, healthy, and no orphan after SIGTERM."""
    config_dir = tmp_path / "configs"
    config_dir.mkdir()
    for name in ("models.yaml", "repos.yaml", "training.yaml", "pipeline.yaml"):
        (config_dir / name).write_text((project_root() / "configs" / name).read_text())
    lanes = read_config(project_root() / "configs" / "lanes.yaml")
    lanes["cpu_lane"]["embedded"]["port"] = 0
    write_config(config_dir / "lanes.yaml", lanes)
    env = {**os.environ, "LANES_CONFIG_DIR": str(config_dir), "LANES_DATA_DIR": str(tmp_path / "data")}
    serve = subprocess.Popen(
        [sys.executable, "-m", "lanes_pipeline.cli", "serve", "cpu"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline().strip()
        assert line.startswith("cpu_lane: http://127.0.0.1:"), line
        url = line.removeprefix("cpu_lane: ")
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        state = json.loads((tmp_path / "data" / "run" / "cpu-lane.json").read_text())
        assert state["url"] == url
        server_pid = state["pid"]
        family = [server_pid, *(child.pid for child in psutil.Process(server_pid).children(recursive=True))]
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
    finally:
        if serve.poll() is None:
            serve.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) for pid in family):
        time.sleep(0.2)
    assert not [pid for pid in family if psutil.pid_exists(pid)], "orphan server processes"
    assert not (tmp_path / "data" / "run" / "cpu-lane.json").exists()


def test_lanes_run_prints_answer_and_speed_of_each_real_lane(
    cpu_server: EmbeddedServer,
    gpu_server: EmbeddedServer,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The main job's CLI against the session's real servers, configured as external lanes, on a private
    data folder and instance (test_daily_run.py covers the whole day; here a day without training rows)."""
    # Every symbol held out: the day's "write the body" rows all go to eval, none to training.
    project = daily_project(
        tmp_path,
        settings,
        cpu_server.url,
        gpu_server.url,
        seed_earlier_day=False,
        dataset={"held_out_percent": 100},
    )
    for name, value in project.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("lanes_pipeline.definitions.defs", lambda: build_definitions(load_settings()))
    result = CliRunner().invoke(main, ["run", "--date", "2026-11-20"])
    assert result.exit_code == 0, result.output
    assert f"[CPU lane] smollm2 @ {cpu_server.url}" in result.output
    assert f"[GPU lane] smollm2-hf @ {gpu_server.url}" in result.output
    assert result.output.count("  answer: ") == 2
    rows = {
        line.split()[0]: line.split()[1]
        for line in result.output.splitlines()
        if line.startswith("  ") and len(line.split()) > 1  # the summary's table rows, not wrapped text
    }
    assert rows["cpu_lane_probe"] == rows["gpu_lane_probe"] == "materialized"
    assert rows["repo_snapshot"] == rows["lora_dataset"] == "materialized"
    # No training rows in the window: no adapter, recorded as a success (issue 12), not skipped.
    assert rows["lora_adapter"] == rows["served_adapter"] == "materialized"

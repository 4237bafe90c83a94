"""Session fixtures: the real embedded lanes start once per test session and always stop, even on failure.

Test servers listen on free ports and are not published in data/run/, so a `make dev` running beside the
suite is neither reused nor disturbed.

A test's lane marks (`cpu_lane`, `gpu_lane`) are not written by hand: they are read from the fixtures it
uses (`pytest_collection_modifyitems`), so `-m "not cpu_lane"` selects what runs without llama-server and
cannot drift from the code. A test that starts a server of its own requests `cpu_engine` / `gpu_engine`;
one that starts a lane's engine in this process without saying so fails (`_servers_started_are_declared`).
The `slow` tier, marked by hand, holds the tests that prove no promise of their own (README "Tests").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import cast, get_args

import pytest

from lanes_pipeline.config.cpu_server import CpuModelKind
from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import EmbeddedServer, LaneName, build_server
from lanes_pipeline.settings import CpuEngineName, Settings, load_settings
from lanes_pipeline_tests import server_worker

# The fixtures that give a test a real lane's server (directly or through the fixtures that use them).
LANE_FIXTURES: dict[LaneName, frozenset[str]] = {
    "cpu": frozenset(
        {
            "cpu_server",
            "cpu_server_ik",
            "cpu_server_upstream",
            "cpu_server_ik_moe",
            "cpu_server_upstream_moe",
            "cpu_server_each_engine",
            "cpu_engine",
        }
    ),
    "gpu": frozenset({"gpu_server", "gpu_engine"}),
}
LANE_MARKS: dict[LaneName, str] = {"cpu": "cpu_lane", "gpu": "gpu_lane"}
# Fixtures that download from the package registry: their tests go to the slow tier, so the fast one needs
# no network beyond the installs.
REGISTRY_FIXTURES = frozenset({"real_package_repo"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test marked with the lanes its fixtures start; a lane mark written by hand is refused (it is
    what drifted: server tests unmarked, pure tests marked)."""
    server_tests = []
    for item in items:
        by_hand = sorted({mark.name for mark in item.iter_markers() if mark.name in LANE_MARKS.values()})
        if by_hand:
            raise pytest.UsageError(
                f"{item.nodeid}: marked {', '.join(by_hand)} by hand; lane marks come from the fixtures a "
                f"test uses (request cpu_engine / gpu_engine to start a server of its own)"
            )
        fixture_names = set(getattr(item, "fixturenames", ()))
        lanes = [lane for lane, fixtures in LANE_FIXTURES.items() if fixtures & fixture_names]
        for lane in lanes:
            item.add_marker(LANE_MARKS[lane])
        if lanes:
            server_tests.append(item.nodeid)
        if REGISTRY_FIXTURES & fixture_names:
            item.add_marker("slow")
    server_worker.record_server_tests(config, server_tests)


# Under pytest-xdist (`make test`) the server tests share one worker (server_worker.py).
def pytest_addoption(parser: pytest.Parser) -> None:
    server_worker.add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    server_worker.configure_controller(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    server_worker.unconfigure(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    server_worker.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    return server_worker.make_scheduler(config, log)


@pytest.fixture(autouse=True)
def _servers_started_are_declared(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that starts a lane's engine in this process (a program from the engines folder; a stand-in
    such as `sh -c ...` is no engine) must carry that lane's mark (from its fixtures)."""
    marks = {mark.name for mark in request.node.iter_markers()}
    start = EmbeddedServer.start

    def declared_start(server: EmbeddedServer) -> EmbeddedServer:
        lane, program = server.command.lane, Path(server.command.argv[0])
        if program.is_relative_to(engines.engines_dir()) and LANE_MARKS[lane] not in marks:
            pytest.fail(
                f"{request.node.nodeid} starts the {lane} lane's engine ({program}) but uses none of "
                f"{sorted(LANE_FIXTURES[lane])}: request {lane}_engine so `-m` selects it"
            )
        return start(server)

    monkeypatch.setattr(EmbeddedServer, "start", declared_start)


@pytest.fixture(scope="session")
def settings() -> Settings:
    """The shipped configs: every CPU-lane test runs on ik_llama.cpp's llama-server, the shipped default
    (LANES_TEST_CPU_ENGINE=llama_cpp runs them all on upstream's instead). The compatibility subset that keeps
    upstream working runs on it whatever the session engine: `cpu_server_each_engine` (test_cpu_engines.py:
    client, a re-run sends nothing, analyses parse; on both engines with the session's model and with the
    upcycled MoE) and `cpu_server_upstream` (one day of the CPU-lane assets), plus the loading-server fault
    tests, parametrized over both engines."""
    engine = os.environ.get("LANES_TEST_CPU_ENGINE", "ik_llama")
    if engine not in get_args(CpuEngineName):
        expected = ", ".join(get_args(CpuEngineName))
        raise pytest.UsageError(f"LANES_TEST_CPU_ENGINE={engine!r}: expected one of {expected}")
    return settings_with_cpu_engine(load_settings(), cast(CpuEngineName, engine))


@pytest.fixture(scope="session")
def cpu_server(settings: Settings) -> Iterator[EmbeddedServer]:
    """The CPU lane's embedded server with the configured engine (cpu_lane.embedded.engine: ik_llama.cpp's
    llama-server by default)."""
    server = build_server(settings, "cpu", port=0, publish=False)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cpu_engine(settings: Settings) -> Path:
    """The session engine's llama-server, for a test that starts its own CPU-lane server (a private one,
    `lanes run`, a drill): requesting it marks the test `cpu_lane`."""
    return engines.cpu_server_binary(settings.lanes.cpu_lane.embedded.engine, settings.data_dir)


@pytest.fixture(scope="session")
def gpu_engine(settings: Settings) -> Path:
    """vLLM's Python and the converted model, for a test that starts its own GPU-lane server: requesting it
    marks the test `gpu_lane`."""
    engines.embedded_hf_model(settings.data_dir)
    return engines.vllm_python(settings.data_dir)


def settings_with_cpu_engine(
    settings: Settings, engine: CpuEngineName, model: CpuModelKind | None = None
) -> Settings:
    """The session's settings with the CPU lane on `engine` (and on `model`, dense or moe, when given)."""
    lane = settings.lanes.cpu_lane
    embedded = lane.embedded.model_copy(update={"engine": engine} | ({"model": model} if model else {}))
    lanes = settings.lanes.model_copy(update={"cpu_lane": lane.model_copy(update={"embedded": embedded})})
    return dataclasses.replace(settings, lanes=lanes)


def _engine_server(
    settings: Settings, engine: CpuEngineName, request: pytest.FixtureRequest
) -> Iterator[EmbeddedServer]:
    """The session's cpu_server when `engine` is the configured one, else a server of that engine."""
    if settings.lanes.cpu_lane.embedded.engine == engine:
        yield request.getfixturevalue("cpu_server")
        return
    yield from _started_cpu_server(settings_with_cpu_engine(settings, engine))


def _started_cpu_server(settings: Settings) -> Iterator[EmbeddedServer]:
    server = build_server(settings, "cpu", port=0, publish=False)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cpu_server_ik(settings: Settings, request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """ik_llama.cpp's llama-server, for the tests of what only it does (or did wrong)."""
    yield from _engine_server(settings, "ik_llama", request)


@pytest.fixture(scope="session")
def cpu_server_upstream(settings: Settings, request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """Upstream llama.cpp's llama-server, for the compatibility subset that keeps both engines working."""
    yield from _engine_server(settings, "llama_cpp", request)


@pytest.fixture(scope="session")
def cpu_server_ik_moe(settings: Settings) -> Iterator[EmbeddedServer]:
    """ik_llama.cpp's llama-server on the upcycled MoE: the compatibility subset runs on ik's MoE path too."""
    yield from _started_cpu_server(settings_with_cpu_engine(settings, "ik_llama", model="moe"))


@pytest.fixture(scope="session")
def cpu_server_upstream_moe(settings: Settings) -> Iterator[EmbeddedServer]:
    """Upstream's llama-server on the upcycled MoE."""
    yield from _started_cpu_server(settings_with_cpu_engine(settings, "llama_cpp", model="moe"))


# The compatibility subset's servers: each engine on the session's model, then each on the MoE (the lane the
# project exists for is a MoE on ik; the shipped default stays the dense model, which the suite runs faster).
CPU_ENGINE_FIXTURES: dict[str, str] = {
    "ik_llama": "cpu_server_ik",
    "llama_cpp": "cpu_server_upstream",
    "ik_llama-moe": "cpu_server_ik_moe",
    "llama_cpp-moe": "cpu_server_upstream_moe",
}


@pytest.fixture(scope="session", params=list(CPU_ENGINE_FIXTURES))
def cpu_server_each_engine(request: pytest.FixtureRequest) -> EmbeddedServer:
    """The compatibility subset runs once per engine (ik_llama.cpp's server, then upstream's) and model (the
    session's, then the upcycled MoE)."""
    server: EmbeddedServer = request.getfixturevalue(CPU_ENGINE_FIXTURES[request.param])
    return server


@pytest.fixture(scope="session")
def gpu_server(settings: Settings) -> Iterator[EmbeddedServer]:
    server = build_server(settings, "gpu", port=0, publish=False)
    try:
        yield server.start()
    finally:
        server.stop()

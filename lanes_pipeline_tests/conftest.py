"""Session fixtures: the real embedded lanes start once per test session and always stop, even on failure.

Test servers listen on free ports and are not published in data/run/, so a `make dev` running beside the
suite is neither reused nor disturbed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import cast, get_args

import pytest

from lanes_pipeline.embedded.servers import EmbeddedServer, build_server
from lanes_pipeline.settings import CpuEngineName, Settings, load_settings


@pytest.fixture(scope="session")
def settings() -> Settings:
    """The shipped configs: every CPU-lane test runs on ik_llama.cpp's llama-server, the shipped default
    (LANES_TEST_CPU_ENGINE=llama_cpp runs them all on upstream's instead). The compatibility subset that keeps
    upstream working runs on it whatever the session engine: `cpu_server_each_engine` (test_cpu_engines.py:
    client, a re-run sends nothing, analyses parse) and `cpu_server_upstream` (one day of the CPU-lane
    assets), plus the loading-server fault tests, parametrized over both engines."""
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


def settings_with_cpu_engine(settings: Settings, engine: CpuEngineName) -> Settings:
    lane = settings.lanes.cpu_lane
    embedded = lane.embedded.model_copy(update={"engine": engine})
    lanes = settings.lanes.model_copy(update={"cpu_lane": lane.model_copy(update={"embedded": embedded})})
    return dataclasses.replace(settings, lanes=lanes)


def _engine_server(
    settings: Settings, engine: CpuEngineName, request: pytest.FixtureRequest
) -> Iterator[EmbeddedServer]:
    """The session's cpu_server when `engine` is the configured one, else a server of that engine."""
    if settings.lanes.cpu_lane.embedded.engine == engine:
        yield request.getfixturevalue("cpu_server")
        return
    server = build_server(settings_with_cpu_engine(settings, engine), "cpu", port=0, publish=False)
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


CPU_ENGINE_FIXTURES: dict[CpuEngineName, str] = {
    "ik_llama": "cpu_server_ik",
    "llama_cpp": "cpu_server_upstream",
}


@pytest.fixture(scope="session", params=get_args(CpuEngineName))
def cpu_server_each_engine(request: pytest.FixtureRequest) -> EmbeddedServer:
    """The compatibility subset runs once per engine: ik_llama.cpp's server, then upstream's."""
    server: EmbeddedServer = request.getfixturevalue(CPU_ENGINE_FIXTURES[request.param])
    return server


@pytest.fixture(scope="session")
def gpu_server(settings: Settings) -> Iterator[EmbeddedServer]:
    server = build_server(settings, "gpu", port=0, publish=False)
    try:
        yield server.start()
    finally:
        server.stop()

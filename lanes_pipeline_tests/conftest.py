"""Session fixtures: the real embedded lanes start once per test session and always stop, even on failure.

Test servers listen on free ports and are not published in data/run/, so a `make dev` running beside the
suite is neither reused nor disturbed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lanes_pipeline.embedded.servers import EmbeddedServer, build_server
from lanes_pipeline.settings import Settings, load_settings


@pytest.fixture(scope="session")
def settings() -> Settings:
    return load_settings()


@pytest.fixture(scope="session")
def cpu_server(settings: Settings) -> Iterator[EmbeddedServer]:
    server = build_server(settings, "cpu", port=0, publish=False)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gpu_server(settings: Settings) -> Iterator[EmbeddedServer]:
    server = build_server(settings, "gpu", port=0, publish=False)
    try:
        yield server.start()
    finally:
        server.stop()

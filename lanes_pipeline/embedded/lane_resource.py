"""What both lane resources share: where the lane is, how to authenticate, and `embedded` resolution."""

from __future__ import annotations

import os
from typing import ClassVar

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from lanes_pipeline.embedded.servers import (
    LANE_LABEL,
    EmbeddedServer,
    LaneName,
    build_lane_server,
    running_embedded_url,
)
from lanes_pipeline.http import OpenAIClient
from lanes_pipeline.settings import CpuLane, GpuLane, LaneConnection, RetryPolicy, data_dir


def resolve_lane_url(lane: LaneName, connection: LaneConnection) -> tuple[str, EmbeddedServer | None]:
    """The URL to call, and the server this call started (the caller stops it), if it had to start one.

    `embedded` reuses the server that `lanes serve`, `make run` or `make dev` published; with none running,
    a run starts its own for its duration, so the UI works on a fresh machine with nothing configured. That
    server is built from the resource's own lane config (the folder the definitions were loaded from), not
    from the configs of the default folder read again.
    """
    if not connection.is_embedded:
        return connection.base_url, None
    running = running_embedded_url(data_dir(), lane)
    if running is not None:
        return running, None
    server = build_lane_server(_server_config(lane, connection), data_dir(), publish=True).start()
    return server.url, server


def _server_config(lane: LaneName, connection: LaneConnection) -> CpuLane | GpuLane:
    """The lane's own config model, which says how to start its embedded server (port, slots, model...)."""
    if not isinstance(connection, CpuLane | GpuLane):
        raise TypeError(
            f"the {LANE_LABEL[lane]} lane's resource gave a {type(connection).__name__}: an embedded server "
            "is started from the lane's config model (CpuLane or GpuLane)"
        )
    return connection


class LaneEndpoint(ConfigurableResource):
    """Base of both lane resources: where the lane is and how to reach it (`connection()`), resolved once
    per run; `lane` says which one. Each lane's resource holds its config model, so `connection()` is that
    model and no setting is declared twice."""

    lane: ClassVar[LaneName]

    _url: str | None = PrivateAttr(default=None)
    _owned_server: EmbeddedServer | None = PrivateAttr(default=None)

    def connection(self) -> LaneConnection:
        raise NotImplementedError(f"{type(self).__name__} must say where its lane is")

    def retry_policy(self) -> RetryPolicy:
        return self.connection().retry_policy()

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._url, self._owned_server = resolve_lane_url(self.lane, self.connection())

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._owned_server is not None:
            self._owned_server.stop()
            self._owned_server = None

    @property
    def url(self) -> str:
        if self._url is None:  # used outside a run (CLI, tests)
            self._url, self._owned_server = resolve_lane_url(self.lane, self.connection())
        return self._url

    def api_key(self) -> str | None:
        name = self.connection().api_key_env
        return os.environ.get(name) if name else None

    def client(self) -> OpenAIClient:
        connection = self.connection()
        return OpenAIClient(
            LANE_LABEL[self.lane],
            self.url,
            self.api_key(),
            timeout_s=connection.request_timeout_s,
            connect_timeout_s=connection.connect_timeout_s,
            retry=self.retry_policy(),
        )

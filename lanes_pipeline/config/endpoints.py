"""`cpu_lane.endpoints`: one entry per llama-server of a CPU lane with several, and how two spellings of
one server are told apart (a duplicate is an error, named by its index)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from lanes_pipeline.config.base import EMBEDDED, StrictModel, check_base_url, check_env_var_name


def normalised_url(url: str) -> str:
    """A server's URL in one spelling, so two spellings of the same server compare equal: scheme and host in
    lower case, the scheme's default port made explicit, `localhost` as 127.0.0.1, no trailing slash."""
    match = re.match(r"^(https?)://([^/:\s]+|\[[^\]]+\])(?::(\d+))?(/.*)?$", url.strip(), re.IGNORECASE)
    if match is None:
        return url.strip().rstrip("/")
    scheme, host, port, path = match.group(1).lower(), match.group(2).lower(), match.group(3), match.group(4)
    host = "127.0.0.1" if host in ("localhost", "[::1]") else host
    port = port or ("443" if scheme == "https" else "80")
    return f"{scheme}://{host}:{int(port)}{(path or '').rstrip('/')}"


class CpuEndpoint(StrictModel):
    """One llama-server of a CPU lane with several (`cpu_lane.endpoints`)."""

    base_url: str = Field(description="the server's URL, e.g. http://10.0.0.5:8081")
    slots: int = Field(ge=1, le=256, description="requests in flight on it at most (no more than its -np)")
    api_key_env: str | None = Field(None, description="its key's env var; unset: cpu_lane.api_key_env")

    _api_key_env = field_validator("api_key_env")(check_env_var_name)

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value == EMBEDDED:
            raise ValueError(
                "'embedded' is one bundled server: write `base_url: embedded` instead of an endpoint list"
            )
        return check_base_url(value)


def duplicate_endpoints(endpoints: list[CpuEndpoint]) -> list[tuple[int, int]]:
    """(index, index of its first occurrence) for each endpoint naming a server listed before it."""
    first: dict[str, int] = {}
    duplicates = []
    for index, endpoint in enumerate(endpoints):
        key = normalised_url(endpoint.base_url)
        if key in first:
            duplicates.append((index, first[key]))
        else:
            first[key] = index
    return duplicates

"""What every config model builds on: the error that lists every bad value, the strict base model, and
the checks of a server URL and an environment variable name (`config/models.py` re-exports them); and the
one frozen base of the pipeline's own rows and results."""

from __future__ import annotations

import re
from typing import Any

from dagster import Config
from pydantic import BaseModel, ConfigDict


class ConfigIssue:
    """One bad value: where it is and why it is wrong."""

    def __init__(self, file: str, key: str, reason: str) -> None:
        self.file, self.key, self.reason = file, key, reason

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.reason}" if self.key else f"{self.file}: {self.reason}"

    def __repr__(self) -> str:
        return f"ConfigIssue({self!s})"


class ConfigError(Exception):
    """Every bad value found, not just the first: a user fixes them all in one pass."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(map(str, issues)))


EMBEDDED = "embedded"
ENV_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class StrictModel(Config, BaseModel):  # BaseModel named too: Config is one, and linters then know it
    """Every config model. A dagster `Config` (a frozen pydantic model), so a resource holds the settings it
    needs as a nested field: each setting is declared, with its default, once, here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def __init__(self, **values: Any) -> None:
        # Pydantic's own validation, not Config's: Config.__init__ fills a missing required key with None,
        # which would turn "required key is missing" into a type error about None.
        BaseModel.__init__(self, **values)


class Frozen(BaseModel):
    """A row or result the pipeline builds: immutable once made, and a misspelt field is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def check_base_url(value: str) -> str:
    if value == EMBEDDED or re.match(r"^https?://[^/\s]+", value):
        return value.rstrip("/")
    raise ValueError(f"{value!r} is neither 'embedded' nor an http(s) URL")


def check_env_var_name(value: str | None) -> str | None:
    if value is not None and not ENV_VAR_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid environment variable name")
    return value

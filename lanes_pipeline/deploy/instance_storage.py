"""Before Dagster opens the instance: when its dagster.yaml keeps storage in Postgres (dagster.postgres.yaml),
every environment variable it reads is set and the server answers. Otherwise Dagster fails deep in its own
traceback (an unset variable, or SQLAlchemy's retry loop against a closed port); here the error names the
file, the key, the variable, and the host and port that did not answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel

from lanes_pipeline.config.models import ConfigError, ConfigIssue

# Dagster storages that may live in Postgres besides `storage: postgres:` (dagster_postgres.* classes).
STORAGE_KEYS = ("run_storage", "event_log_storage", "schedule_storage")
# postgres_db's keys with Dagster's defaults for those that have one.
DB_KEYS = ("hostname", "port", "username", "password", "db_name")
DEFAULTS = {"port": "5432", "password": ""}
CONNECT_TIMEOUT_S = 5
HINT = "`make postgres` starts a local one; then `source data/postgres/env`"


class PgTarget(BaseModel):
    """One Postgres connection a dagster.yaml asks for, its values resolved."""

    key: str  # where in dagster.yaml, e.g. storage.postgres
    host: str
    port: int
    url: str | None = None  # postgres_url, when the file gives one
    params: dict[str, str] = {}  # psycopg2.connect's keywords (postgres_db)
    origin: dict[str, str] = {}  # postgres_db key (or postgres_url) -> the variable it was read from

    def where(self) -> str:
        read = ", ".join(f"{key} from ${name}" for key, name in self.origin.items())
        return read or "values written in the file"


def postgres_blocks(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(key, config) of each Postgres storage a parsed dagster.yaml declares."""
    blocks = []
    storage = config.get("storage")
    if isinstance(storage, Mapping) and isinstance(storage.get("postgres"), Mapping):
        blocks.append(("storage.postgres", storage["postgres"]))
    for key in STORAGE_KEYS:
        entry = config.get(key)
        if isinstance(entry, Mapping) and str(entry.get("module", "")).startswith("dagster_postgres"):
            blocks.append((f"{key}.config", entry.get("config") or {}))
    return blocks


def _resolve(
    value: Any,
    key: str,
    file: str,
    environ: Mapping[str, str],
    issues: list[ConfigIssue],
    origin: dict[str, str],
) -> str | None:
    """A StringSource/IntSource value: written in the file, or {env: NAME} read from `environ`."""
    if isinstance(value, Mapping) and set(value) == {"env"}:
        name = str(value["env"])
        origin[key.rsplit(".", 1)[-1]] = name
        if name not in environ:
            issues.append(ConfigIssue(file, key, f"reads ${name}, which is not set ({HINT})"))
            return None
        return environ[name]
    return None if value is None else str(value)


def postgres_targets(config: Mapping[str, Any], file: str, environ: Mapping[str, str]) -> list[PgTarget]:
    """The connections a parsed dagster.yaml asks for; ConfigError naming each unset variable or bad value."""
    issues: list[ConfigIssue] = []
    targets = []
    for key, block in postgres_blocks(config):
        origin: dict[str, str] = {}
        if "postgres_url" in block:
            url = _resolve(block["postgres_url"], f"{key}.postgres_url", file, environ, issues, origin)
            if url is not None:
                parts = urlsplit(url)
                targets.append(PgTarget(key=key, host=parts.hostname or "", port=parts.port or 5432, url=url))
            continue
        db = block.get("postgres_db")
        if not isinstance(db, Mapping):
            issues.append(ConfigIssue(file, key, "needs postgres_db (or postgres_url)"))
            continue
        values = {
            name: _resolve(
                db.get(name, DEFAULTS.get(name)), f"{key}.postgres_db.{name}", file, environ, issues, origin
            )
            for name in DB_KEYS
        }
        missing = [name for name in DB_KEYS if db.get(name, DEFAULTS.get(name)) is None]
        issues += [ConfigIssue(file, f"{key}.postgres_db.{name}", "is required") for name in missing]
        if any(value is None for value in values.values()):
            continue
        port = str(values["port"])
        if not port.isdigit():
            name = f" (${origin['port']})" if "port" in origin else ""
            issues.append(
                ConfigIssue(file, f"{key}.postgres_db.port", f"{port!r}{name} is not a port number")
            )
            continue
        params = {
            "host": str(values["hostname"]),
            "port": port,
            "user": str(values["username"]),
            "password": str(values["password"]),
            "dbname": str(values["db_name"]),
        }
        targets.append(PgTarget(key=key, host=params["host"], port=int(port), params=params, origin=origin))
    if issues:
        raise ConfigError(issues)
    return targets


def unreachable(target: PgTarget) -> str | None:
    """Why the target's database does not answer, or None when it does."""
    import psycopg2

    try:
        if target.url is not None:
            connection = psycopg2.connect(target.url, connect_timeout=CONNECT_TIMEOUT_S)
        else:
            connection = psycopg2.connect(connect_timeout=CONNECT_TIMEOUT_S, **target.params)
    except psycopg2.Error as exc:
        return " ".join(str(exc).split())
    connection.close()
    return None


def check_instance_storage(dagster_home: Path, environ: Mapping[str, str]) -> None:
    """ConfigError when the instance's Postgres storage lacks a variable or does not answer."""
    path = dagster_home / "dagster.yaml"
    if not path.exists():
        return
    file = str(path.resolve())
    config = yaml.safe_load(path.read_text()) or {}
    issues = []
    seen: set[tuple[str, int, str]] = set()
    for target in postgres_targets(config, file, environ):
        ident = (target.host, target.port, target.url or target.params.get("dbname", ""))
        if ident in seen:
            continue
        seen.add(ident)
        reason = unreachable(target)
        if reason is not None:
            message = f"Postgres at {target.host}:{target.port} ({target.where()}) is unreachable: {reason}"
            issues.append(ConfigIssue(file, target.key, f"{message} ({HINT})"))
    if issues:
        raise ConfigError(issues)

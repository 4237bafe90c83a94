"""The CPU lane's content-addressed response cache: one SQLite file in WAL mode.

Idempotency comes from here, not from re-asking: llama-server is not bit-identical across slot counts or
batch sizes even at temperature 0, so a re-run must find the first answer instead of asking again.

The key is the hash of the canonical request (messages, schema, sampling parameters, max tokens) together
with a fingerprint of the served weights, so a different model behind the same alias never hits an old
entry. Each response is committed on its own as it arrives (`synchronous=FULL`): a killed batch loses
nothing it had received, and the re-run asks only for what is missing.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from lanes_pipeline.http import ChatRequest
from lanes_pipeline.store import canonical_json, sha256_bytes

# Bump when what goes into a key changes: old entries then simply stop matching.
KEY_VERSION = 1
SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 30_000


class WeightsIdentity(BaseModel):
    """What identifies the served weights: the configured model name plus what the server says it loaded.

    `model_path` and `meta` (size, parameter count, vocabulary...) come from `/props` and `/v1/models`;
    the alias is deliberately absent, since the same alias can front different weights.
    """

    model_config = ConfigDict(frozen=True)

    configured_model: str
    model_path: str | None = None
    meta: dict[str, Any] = {}

    def fingerprint(self) -> str:
        return sha256_bytes(canonical_json(self.model_dump(mode="json")))


def canonical_request(request: ChatRequest) -> dict[str, Any]:
    """The parts of a request that decide the answer; the alias (`model`) is left to the fingerprint."""
    payload = request.payload()
    payload.pop("model", None)
    return payload


def cache_key(request: ChatRequest, fingerprint: str) -> str:
    return sha256_bytes(
        canonical_json({"v": KEY_VERSION, "weights": fingerprint, "request": canonical_request(request)})
    )


class CacheEntry(BaseModel):
    """One committed answer: the text, its parsed JSON when a schema was asked, and how it was obtained."""

    key: str
    fingerprint: str
    item_id: str
    text: str
    parsed: Any = None
    metrics: dict[str, Any]
    # The per-slot context the varying part was shrunk to fit, or None when the prompt was sent whole: an
    # entry shrunk for another context size (or wanted by a caller who asks for an error) is not a hit.
    shrunk_for_ctx: int | None = None
    attempts: int = 1
    repaired: bool = False
    created_at: float = 0.0
    # When the run that asked read the cache (0: unknown). An entry another run committed after that moment
    # is kept over this one: two runs asking the same request at once then both use one answer.
    read_at: float = 0.0


class FailureRecord(BaseModel):
    key: str
    fingerprint: str
    item_id: str
    kind: str
    reason: str
    attempts: int
    failed_at: float


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS responses ("
    " key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, created_at REAL NOT NULL, entry TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS responses_fingerprint ON responses (fingerprint)",
    "CREATE TABLE IF NOT EXISTS failures ("
    " key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, failed_at REAL NOT NULL, record TEXT NOT NULL)",
)


class ResponseCache:
    """Thread-safe (one connection behind a lock) and safe across processes (WAL, busy timeout)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: every write below is its own explicit transaction, committed before returning.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = self._journal_mode_wal()
            if str(mode).lower() != "wal":
                raise RuntimeError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
            # FULL: a commit survives power loss too, not only a killed process; one fsync per answer is
            # nothing next to seconds of generation.
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    self._db.execute(statement)
                self._db.execute(
                    "INSERT OR IGNORE INTO meta (name, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _journal_mode_wal(self) -> str:
        """Switch to WAL. SQLite answers "database is locked" at once, without its busy handler, while
        another connection is switching a new file's mode (seen: two runs opening one fresh cache at
        once), so that case is tried again, for as long as the busy timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                return str(self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def journal_mode(self) -> str:
        with self._lock:
            return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    def get(self, key: str) -> CacheEntry | None:
        with self._lock:
            row = self._db.execute("SELECT entry FROM responses WHERE key = ?", (key,)).fetchone()
        return CacheEntry.model_validate_json(row[0]) if row else None

    def get_many(self, keys: list[str]) -> dict[str, CacheEntry]:
        found: dict[str, CacheEntry] = {}
        unique = list(dict.fromkeys(keys))
        with self._lock:
            for start in range(0, len(unique), 500):  # SQLite's bound-parameter limit
                chunk = unique[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT entry FROM responses WHERE key IN ({marks})", chunk
                ).fetchall()
                for (raw,) in rows:
                    entry = CacheEntry.model_validate_json(raw)
                    found[entry.key] = entry
        return found

    def put(self, entry: CacheEntry) -> None:
        """Commit one answer now; an earlier failure of the same request is cleared with it, atomically.
        An entry committed since `entry.read_at` (by another run asking at the same time) is kept instead:
        the fault drills' concurrent runs found two runs of a day writing different artifacts otherwise."""
        if not entry.created_at:
            entry = entry.model_copy(update={"created_at": time.time()})
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                newer = (
                    entry.read_at
                    and self._db.execute(
                        "SELECT 1 FROM responses WHERE key = ? AND created_at >= ?",
                        (entry.key, entry.read_at),
                    ).fetchone()
                )
                if newer:
                    self._db.execute("COMMIT")
                    return
                self._db.execute(
                    "INSERT OR REPLACE INTO responses (key, fingerprint, created_at, entry)"
                    " VALUES (?, ?, ?, ?)",
                    (entry.key, entry.fingerprint, entry.created_at, entry.model_dump_json()),
                )
                self._db.execute("DELETE FROM failures WHERE key = ?", (entry.key,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def record_failure(self, record: FailureRecord) -> None:
        """Failures are kept for inspection only: they are never hits, so a re-run asks again."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO failures (key, fingerprint, failed_at, record) VALUES (?, ?, ?, ?)",
                (record.key, record.fingerprint, record.failed_at, record.model_dump_json()),
            )

    def failures(self) -> list[FailureRecord]:
        with self._lock:
            rows = self._db.execute("SELECT record FROM failures ORDER BY failed_at").fetchall()
        return [FailureRecord.model_validate_json(raw) for (raw,) in rows]

    def count(self, fingerprint: str | None = None) -> int:
        with self._lock:
            if fingerprint is None:
                return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])
            query = "SELECT COUNT(*) FROM responses WHERE fingerprint = ?"
            return int(self._db.execute(query, (fingerprint,)).fetchone()[0])

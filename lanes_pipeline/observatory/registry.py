"""The trial registry: every trial run, its exact command line and its figures, in SQLite under the data
folder (`<data>/observatory/trials.sqlite3`). A failed start is a row too, with the server's log tail."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pydantic import BaseModel

from lanes_pipeline.observatory.interference import InterferenceFigures
from lanes_pipeline.observatory.measure import LaneFigures


class ModelParams(BaseModel):
    """What a trial's model is: MoE or dense, and its parameters one token uses and in all, in billions;
    read from the GGUF's tensors (CPU lane) or from models.yaml (an HF folder, a GGUF split in parts)."""

    moe: bool
    active_params_b: float
    total_params_b: float
    source: str  # "gguf", or "models.yaml" (with why, when a GGUF's own header was not used)


class TrialRecord(BaseModel):
    name: str
    lane: str
    engine: str = ""  # ik_llama, llama_cpp, vllm, own command (empty in rows recorded before it existed)
    model: str
    quant: str
    threads: int | None
    slots: int
    started: str  # ISO timestamp, UTC
    command: str  # the exact command line, shell-quoted
    ok: bool
    wall_s: float
    figures: LaneFigures | None = None
    params: ModelParams | None = None  # None in rows recorded before it existed
    read_back: dict[str, str] = {}  # what the server's log says it took (embedded/engine_log.py)
    interference: float | None = None  # this lane's tok/s beside the other lane's load / alone
    interference_detail: InterferenceFigures | None = None
    error: str | None = None
    log_tail: str | None = None


def registry_path(data_dir: Path) -> Path:
    return data_dir / "observatory" / "trials.sqlite3"


class TrialRegistry:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, timeout=30)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, "
            "started TEXT NOT NULL, ok INTEGER NOT NULL, record TEXT NOT NULL)"
        )
        self._db.commit()

    def __enter__(self) -> TrialRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def add(self, record: TrialRecord) -> None:
        self._db.execute(
            "INSERT INTO runs (name, started, ok, record) VALUES (?, ?, ?, ?)",
            (record.name, record.started, int(record.ok), record.model_dump_json()),
        )
        self._db.commit()

    def all(self) -> list[TrialRecord]:
        rows = self._db.execute("SELECT record FROM runs ORDER BY id").fetchall()
        return [TrialRecord.model_validate_json(row[0]) for row in rows]

    def latest(self, names: list[str] | None = None) -> list[TrialRecord]:
        """The last run of each trial (of `names`, in that order; else in order of first run)."""
        last: dict[str, TrialRecord] = {}
        for record in self.all():
            last[record.name] = record
        if names is None:
            return list(last.values())
        return [last[name] for name in names if name in last]

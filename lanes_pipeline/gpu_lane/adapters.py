"""LoRA adapters for the GPU lane: vLLM's compatibility rules (pure), and the version registry (SQLite).

Every trained adapter is a *version* in its own folder, `<adapters>/<prefix>-<YYYY-MM-DD>[-<n>]/`, never
rewritten. The registry records each version (date, path, training and eval figures, status) and where the
stable alias (`<prefix>-current`) points, with the history of its moves, so a rollback knows where to go.
"""

from __future__ import annotations

import fcntl
import json
import posixpath
import re
import sqlite3
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lanes_pipeline.errors import AliasMoveInProgressError
from lanes_pipeline.settings import VLLM_LORA_RANKS, AdapterPathMap

Status = Literal["candidate", "promoted", "rejected", "rolled_back"]
STATUSES: tuple[Status, ...] = ("candidate", "promoted", "rejected", "rolled_back")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# PEFT inits that only set the starting weights; the others (PiSSA, OLoRA, LoftQ, CorDA) change the base.
PLAIN_INITS = {"gaussian", "eva", "orthogonal", "mica", "lora_ga"}
_LAYER_WEIGHT = re.compile(r"\.layers\.\d+\.(?:.+\.)?([A-Za-z0-9_]+)\.weight$")
_LORA_KEY = re.compile(
    r"\.([A-Za-z0-9_]+)\.lora_(?:A|B|embedding_A|embedding_B)(?:\.[A-Za-z0-9_]+)?\.weight$"
)


# -- compatibility rules (pure) ----------------------------------------------------------------------------


class Incompatibility(BaseModel):
    model_config = ConfigDict(frozen=True)

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


class IncompatibleAdapterError(ValueError):
    def __init__(self, where: str, issues: list[Incompatibility]) -> None:
        self.issues = issues
        listed = "; ".join(map(str, issues))
        super().__init__(f"adapter {where} cannot be loaded into vLLM: {listed}")


def check_lora_config(
    config: dict[str, Any], max_lora_rank: int, supported_modules: set[str]
) -> list[Incompatibility]:
    """Every reason vLLM would refuse an adapter with this `adapter_config.json`, or the lane would (rank)."""
    issues: list[Incompatibility] = []

    def bad(field: str, reason: str) -> None:
        issues.append(Incompatibility(field=field, reason=reason))

    if config.get("peft_type", "LORA") != "LORA":
        bad("peft_type", f"{config.get('peft_type')!r} is not LORA")
    rank = config.get("r")
    ranks = [rank, *dict(config.get("rank_pattern") or {}).values()]
    if not isinstance(rank, int) or rank <= 0:
        bad("r", f"{rank!r} is not a positive integer")
    else:
        for value in ranks:
            if value not in VLLM_LORA_RANKS:
                bad("r", f"rank {value} is not one of vLLM's ranks {', '.join(map(str, VLLM_LORA_RANKS))}")
            elif value > max_lora_rank:
                bad("r", f"rank {value} is greater than the lane's max_lora_rank {max_lora_rank}")
    if "lora_alpha" not in config:
        bad("lora_alpha", "missing")
    if config.get("use_dora"):
        bad("use_dora", "vLLM does not support DoRA")
    if config.get("bias", "none") != "none":
        bad("bias", f"{config.get('bias')!r}: vLLM supports only 'none'")
    if config.get("lora_bias"):
        bad("lora_bias", "vLLM does not support LoRA bias")
    if config.get("modules_to_save"):
        bad("modules_to_save", f"{config['modules_to_save']!r}: vLLM serves no fully trained modules")
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in PLAIN_INITS:
        bad("init_lora_weights", f"{init!r} changes the base weights; vLLM serves the unchanged base")
    if config.get("layer_replication"):
        bad("layer_replication", "vLLM does not support layer replication")
    if config.get("use_qalora"):
        bad("use_qalora", "vLLM does not support QALoRA")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        bad("target_modules", f"a regular expression ({targets!r}) cannot be checked; list the module names")
    elif not targets:
        bad("target_modules", "empty")
    else:
        unsupported = sorted(set(targets) - supported_modules)
        if unsupported:
            bad(
                "target_modules",
                f"{', '.join(unsupported)} not in the base model's LoRA-able modules "
                f"({', '.join(sorted(supported_modules))})",
            )
    return issues


def check_weight_keys(keys: Iterable[str], supported_modules: set[str]) -> list[Incompatibility]:
    """Saved tensors must be LoRA A/B matrices of supported modules: no DoRA magnitudes, no full copies."""
    issues: list[Incompatibility] = []
    seen_lora = False
    for key in keys:
        if "lora_magnitude_vector" in key:
            issues.append(Incompatibility(field="weights", reason=f"{key} is a DoRA magnitude"))
            continue
        match = _LORA_KEY.search(key)
        if match is None:
            issues.append(Incompatibility(field="weights", reason=f"{key} is not a LoRA A/B weight"))
        elif match.group(1) not in supported_modules:
            issues.append(
                Incompatibility(field="weights", reason=f"{key} targets unsupported {match.group(1)}")
            )
        else:
            seen_lora = True
    if not seen_lora and not issues:
        issues.append(Incompatibility(field="weights", reason="no LoRA weights"))
    return issues


def linear_modules_from_weight_names(names: Iterable[str], shapes: dict[str, list[int]]) -> set[str]:
    """LoRA-able modules of a decoder: the 2-D `.weight`s inside `layers.N` (projections; norms are 1-D)."""
    modules = set()
    for name in names:
        match = _LAYER_WEIGHT.search(name)
        if match and len(shapes.get(name, [])) == 2:
            modules.add(match.group(1))
    return modules


# -- reading folders ----------------------------------------------------------------------------------------


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (names, dtypes, shapes) without reading the tensors."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header


def supported_target_modules(base_model_dir: Path) -> set[str]:
    """The module names vLLM can put a LoRA on for this base model (a Hugging Face folder)."""
    shapes: dict[str, list[int]] = {}
    files = sorted(base_model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {base_model_dir}")
    for file in files:
        shapes.update({name: info["shape"] for name, info in safetensors_header(file).items()})
    return linear_modules_from_weight_names(shapes, shapes)


def check_adapter_dir(adapter_dir: Path, max_lora_rank: int, supported_modules: set[str]) -> None:
    """Raise IncompatibleAdapterError, naming every problem, unless vLLM will load this folder."""
    if not adapter_dir.is_dir():
        where = "missing on this machine, where the lane reads it before asking vLLM to load it"
        raise IncompatibleAdapterError(str(adapter_dir), [Incompatibility(field="folder", reason=where)])
    config_path, weights_path = adapter_dir / ADAPTER_CONFIG, adapter_dir / ADAPTER_WEIGHTS
    missing = [p.name for p in (config_path, weights_path) if not p.is_file()]
    if missing:
        issues = [Incompatibility(field=name, reason="missing") for name in missing]
        raise IncompatibleAdapterError(str(adapter_dir), issues)
    config = json.loads(config_path.read_text(encoding="utf-8"))
    issues = check_lora_config(config, max_lora_rank, supported_modules)
    issues += check_weight_keys(safetensors_header(weights_path), supported_modules)
    if issues:
        raise IncompatibleAdapterError(str(adapter_dir), issues)


# -- where vLLM finds a folder (pure, but for the local check) -------------------------------------------


class AdapterPathMapError(ValueError):
    pass


def vllm_path(local: str, mapping: AdapterPathMap | None) -> str:
    """The path vLLM is given for the adapter folder `local` of this machine: the same path, or its place
    under `mapping.remote` when vLLM runs elsewhere (gpu_lane.adapter_paths)."""
    if mapping is None:
        return local
    relative = posixpath.relpath(posixpath.normpath(local), mapping.local) if local.startswith("/") else ".."
    if relative == ".." or relative.startswith("../"):
        raise AdapterPathMapError(
            f"adapter folder {local} is not under gpu_lane.adapter_paths.local ({mapping.local}), so it has "
            f"no path on vLLM's side ({mapping.remote}); train into that folder or change the mapping"
        )
    return mapping.remote if relative == "." else posixpath.join(mapping.remote, relative)


def missing_on_vllm_side(local: str, remote: str, mapping: AdapterPathMap | None) -> str:
    """What to say when vLLM finds no adapter at `remote` although this machine has `local`."""
    if mapping is None:
        return (
            f"the folder is on this machine ({local}) but not on vLLM's side: vLLM must see the same "
            "absolute path; when it runs on another machine, set gpu_lane.adapter_paths (local -> remote)"
        )
    return (
        f"the folder is on this machine ({local}) but missing on vLLM's side ({remote}, mapped by "
        f"gpu_lane.adapter_paths {mapping.local} -> {mapping.remote}): sync the adapters folder to the "
        "server, e.g. by a shared filesystem mounted at that path"
    )


def local_side_problem(mapping: AdapterPathMap | None) -> str | None:
    """Why the mapping's local side cannot work (for `lanes config check`), or None."""
    if mapping is None or Path(mapping.local).is_dir():
        return None
    return f"{mapping.local} does not exist on this machine (the local side of the mapping)"


# -- naming -------------------------------------------------------------------------------------------------


def version_name(prefix: str, day: date, n: int = 1) -> str:
    """`<prefix>-<YYYY-MM-DD>` for a day's first version, `-<n>` from its second on."""
    return f"{prefix}-{day.isoformat()}" + (f"-{n}" if n > 1 else "")


def next_version_name(prefix: str, day: date, taken: Iterable[str]) -> str:
    taken = set(taken)
    n = 1
    while version_name(prefix, day, n) in taken:
        n += 1
    return version_name(prefix, day, n)


# -- the registry -------------------------------------------------------------------------------------------


class Version(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    day: date
    path: str
    status: Status
    fingerprint: str
    created_at: str
    promoted_at: str | None = None
    training: dict[str, Any] = {}
    evaluation: dict[str, Any] = {}


class AliasMove(BaseModel):
    model_config = ConfigDict(frozen=True)

    alias: str
    version: str
    moved_at: str
    reason: str


_SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
    name TEXT PRIMARY KEY,
    day TEXT NOT NULL,
    path TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at TEXT NOT NULL,
    promoted_at TEXT,
    training TEXT NOT NULL DEFAULT '{}',
    evaluation TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS alias_moves (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    alias TEXT NOT NULL,
    version TEXT NOT NULL REFERENCES versions(name),
    moved_at TEXT NOT NULL,
    reason TEXT NOT NULL
);
"""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class UnknownVersionError(LookupError):
    pass


class AdapterRegistry:
    """SQLite file beside the adapter folders. One short transaction per call, so a CLI, a sensor and a run
    can use it at once (SQLite's own locking, with a wait)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def alias_move(self, wait: bool = True) -> Iterator[None]:
        """Held from an alias move on vLLM until the registry records it (promote, rollback) and while a
        restore compares and corrects them: without it, a restore between a promotion's move and its record
        would move the alias back. A lock file beside the registry (flock: released when its holder ends,
        also when it is killed mid-move, so a restore can then correct what the dead move left).
        `wait=False`: AliasMoveInProgressError at once when another process holds it."""
        lock_path = self.path.with_name(self.path.name + ".alias-move.lock")
        with lock_path.open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AliasMoveInProgressError(
                    f"an alias move is in progress ({lock_path} is held by another process)"
                ) from None
            yield  # the lock goes with the file's closing

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30.0)
        db.row_factory = sqlite3.Row
        try:
            with db:  # commit on success, roll back on error
                yield db
        finally:
            db.close()

    @staticmethod
    def _version(row: sqlite3.Row) -> Version:
        data = dict(row)
        data["training"], data["evaluation"] = json.loads(data["training"]), json.loads(data["evaluation"])
        return Version.model_validate(data)

    def add(self, name: str, day: date, path: Path, fingerprint: str, training: dict[str, Any]) -> Version:
        with self._db() as db:
            db.execute(
                "INSERT INTO versions (name, day, path, status, fingerprint, created_at, training) "
                "VALUES (?, ?, ?, 'candidate', ?, ?, ?)",
                (name, day.isoformat(), str(path), fingerprint, _now(), json.dumps(training, sort_keys=True)),
            )
        return self.get(name)

    def get(self, name: str) -> Version:
        with self._db() as db:
            row = db.execute("SELECT * FROM versions WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise UnknownVersionError(f"no adapter version {name!r} in {self.path}")
        return self._version(row)

    def versions(self, day: date | None = None) -> list[Version]:
        """Oldest first."""
        query, args = "SELECT * FROM versions", ()
        if day is not None:
            query, args = query + " WHERE day = ?", (day.isoformat(),)
        with self._db() as db:
            rows = db.execute(query + " ORDER BY created_at, name", args).fetchall()
        return [self._version(row) for row in rows]

    def find(self, day: date, fingerprint: str) -> Version | None:
        """A version of this day trained on exactly these inputs, if one exists (a re-run reuses it)."""
        return next((v for v in reversed(self.versions(day)) if v.fingerprint == fingerprint), None)

    def set_status(self, name: str, status: Status) -> Version:
        with self._db() as db:
            self._update_status(db, name, status)
        return self.get(name)

    def _update_status(self, db: sqlite3.Connection, name: str, status: Status) -> None:
        promoted = _now() if status == "promoted" else None
        updated = db.execute(
            "UPDATE versions SET status = ?, promoted_at = COALESCE(?, promoted_at) WHERE name = ?",
            (status, promoted, name),
        ).rowcount
        if not updated:
            raise UnknownVersionError(f"no adapter version {name!r} in {self.path}")

    def record_evaluation(self, name: str, evaluation: dict[str, Any]) -> Version:
        with self._db() as db:
            db.execute(
                "UPDATE versions SET evaluation = ? WHERE name = ?",
                (json.dumps(evaluation, sort_keys=True), name),
            )
        return self.get(name)

    def record_alias(self, alias: str, version: str, reason: str) -> None:
        with self._db() as db:
            db.execute(
                "INSERT INTO alias_moves (alias, version, moved_at, reason) VALUES (?, ?, ?, ?)",
                (alias, version, _now(), reason),
            )

    def record_move(self, alias: str, version: str, reason: str, statuses: dict[str, Status]) -> None:
        """The alias move and the statuses it implies (promoted, rolled back) in one transaction: a run
        killed in between leaves both or neither (the fault drills found a version marked promoted that
        the alias never pointed at, when these were two calls)."""
        with self._db() as db:
            for name, status in statuses.items():
                self._update_status(db, name, status)
            db.execute(
                "INSERT INTO alias_moves (alias, version, moved_at, reason) VALUES (?, ?, ?, ?)",
                (alias, version, _now(), reason),
            )

    def alias_history(self, alias: str) -> list[AliasMove]:
        """Oldest first."""
        with self._db() as db:
            rows = db.execute(
                "SELECT alias, version, moved_at, reason FROM alias_moves WHERE alias = ? ORDER BY seq",
                (alias,),
            ).fetchall()
        return [AliasMove.model_validate(dict(row)) for row in rows]

    def alias_target(self, alias: str) -> Version | None:
        history = self.alias_history(alias)
        return self.get(history[-1].version) if history else None

    def promoted(self) -> list[Version]:
        """Promoted versions, most recently promoted first."""
        chosen = [v for v in self.versions() if v.status == "promoted"]
        return sorted(chosen, key=lambda v: v.promoted_at or "", reverse=True)


def rollback_target(history: list[AliasMove], statuses: dict[str, Status]) -> str | None:
    """Where a rollback moves the alias: the latest earlier alias target that is still promoted.

    Pure: `history` oldest first; `statuses` of the versions named in it. The current target is excluded
    even if it appeared before (an alias can come back to a version).
    """
    if not history:
        return None
    current = history[-1].version
    for move in reversed(history[:-1]):
        if move.version != current and statuses.get(move.version) == "promoted":
            return move.version
    return None


def versions_to_unload(loaded: list[str], keep: list[str], max_loaded: int) -> list[str]:
    """Versioned adapters to unload so at most `max_loaded` stay: keep those in `keep` first (in order)."""
    kept = [name for name in keep if name in loaded][:max_loaded]
    return [name for name in loaded if name not in kept]

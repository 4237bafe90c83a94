"""The memo that makes the CPU-lane assets incremental and idempotent: JSON values in the artifact store under
a key made of what decided them (a blob hash, a commit, the task's version, the configured model), so a
re-run of a day, or a day where a file did not change, finds every answer and verdict and asks nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lanes_pipeline.store import ArtifactStore, canonical_json, sha256_bytes

MEMO = "_memo"


def memo_key(*parts: Any) -> str:
    return sha256_bytes(canonical_json(list(parts)))


class Memo:
    """Content-addressed JSON values in the artifact store (atomic writes, safe to share between runs)."""

    def __init__(self, store: ArtifactStore, namespace: str) -> None:
        self.folder = store.root / MEMO / namespace
        self.store = store
        self.hits = 0

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any | None:
        path = self._path(key)
        if not path.is_file():
            return None
        self.hits += 1
        return json.loads(path.read_text(encoding="utf-8"))

    def put(self, key: str, value: Any) -> None:
        self.store.write_bytes(self._path(key), canonical_json(value))

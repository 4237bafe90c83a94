"""The training window: the `lora_dataset` partitions a day's GPU-lane asset reads.

Which days those are is declared once, as the partition mapping of its dependency on lora_dataset
(daily/partitions.replay_window, applied in loop/lineage.py); the asset asks Dagster for the mapped days
(`context.asset_partition_keys_for_input`) and reads the ones that were saved. Each day is saved in the
contract's format (contract.py). A row seen on several days is trained on once (its latest copy wins).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from lanes_pipeline.dataset.contract import DATASET_ASSET, SPLITS, DatasetContractError, check_row


def dataset_root(artifacts_root: Path) -> Path:
    """`artifacts_root` is the artifact store's root, `<data>/artifacts` unless configured otherwise."""
    return artifacts_root / DATASET_ASSET


def partition_dir(artifacts_root: Path, day: date) -> Path:
    return dataset_root(artifacts_root) / day.isoformat()


def is_complete(folder: Path) -> bool:
    """save_to_disk writes dataset_dict.json first and each split's dataset_info.json last: a folder is
    complete when every split it lists has its info file (the writer should still rename into place)."""
    try:
        splits = json.loads((folder / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return all((folder / split / "dataset_info.json").is_file() for split in splits)


def window_dirs(artifacts_root: Path, days: Iterable[str]) -> list[Path]:
    """The saved lora_dataset folders of `days` (partition keys, as the window's mapping gives them), oldest
    first; a day never materialized, or whose folder is unfinished, is not in the window."""
    folders = [dataset_root(artifacts_root) / day for day in sorted(set(days))]
    return [folder for folder in folders if is_complete(folder)]


def dedupe(rows_by_day: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of all days, oldest day first, each content_hash once (the latest day's copy). Pure."""
    latest: dict[str, dict[str, Any]] = {}
    for rows in rows_by_day:
        for row in rows:
            latest.pop(row["content_hash"], None)  # re-insert: dict order follows the latest day
            latest[row["content_hash"]] = row
    return list(latest.values())


def load_split(dirs: Sequence[str | Path], split: str) -> list[dict[str, Any]]:
    """A split of the window as plain rows (messages, task, content_hash), checked and deduplicated."""
    from datasets import load_from_disk

    per_day = []
    for folder in dirs:
        dataset = load_from_disk(str(folder))
        if split not in dataset:
            raise DatasetContractError(f"{folder}: no {split!r} split (has {', '.join(dataset.keys())})")
        rows = [
            {"messages": row["messages"], "task": row["task"], "content_hash": row["content_hash"]}
            for row in dataset[split]
        ]
        for row in rows:
            check_row(row)
        per_day.append(rows)
    return dedupe(per_day)


def fingerprint(dirs: Sequence[str | Path]) -> str:
    """A hash of the window's content (row hashes of both splits, per day): equal data, equal fingerprint."""
    digest = hashlib.sha256()
    for folder in dirs:
        digest.update(Path(folder).name.encode() + b"\0")
        for split in SPLITS:
            for row in load_split([folder], split):
                digest.update(f"{split}:{row['content_hash']}\0".encode())
    return digest.hexdigest()

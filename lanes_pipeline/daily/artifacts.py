"""How every daily asset writes its partition, and its figures and tables in its metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import MetadataValue
from pydantic import BaseModel, ConfigDict, TypeAdapter

from lanes_pipeline.store import ArtifactStore, sha256_tree


def write_partition(store: ArtifactStore, asset: str, day: str, files: dict[str, Any]) -> str:
    """Replace the asset's partition folder with `files` (name -> JSON value or text) in one rename, and
    return the folder's content hash: equal content, equal hash, whatever ran before."""
    target = store.folder(asset, day)
    with store.atomic_folder(target) as staging:
        for name, value in sorted(files.items()):
            data = value.encode("utf-8") if isinstance(value, str) else _pretty_json(value)
            (staging / name).write_bytes(data)
    return sha256_tree(target)


def read_partition(store: ArtifactStore, asset: str, day: str, name: str, shape: Any, what: str) -> Any:
    """An upstream asset's file `name` of the day, validated as `shape` (a model or a type such as
    dict[str, Model]): a missing partition says to materialize it, a file that does not fit names itself
    and `what` it should hold."""
    where = store.folder(asset, day) / name
    if not where.is_file():
        raise FileNotFoundError(f"{asset} has no partition {day} ({where}): materialize it first")
    try:
        return TypeAdapter(shape).validate_python(store.read_json(asset, day, name))
    except ValueError as exc:
        raise ValueError(f"{where}: not {what}: {exc}") from exc


def _pretty_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=1).encode("utf-8") + b"\n"


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], limit: int = 60) -> MetadataValue:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")[:200]

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"| ... {len(rows) - limit} more |" + " |" * (len(header) - 1))
    return MetadataValue.md("\n".join(lines))


class Figures(BaseModel):
    """Figures of one asset's metadata. Read back from a materialization's whole metadata (other keys are
    ignored); a figure it lacks reads as 0."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> Any:
        return cls.model_validate(dict(metadata))

    def metadata(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)

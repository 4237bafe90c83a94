"""A GGUF file's header: its scalar metadata and its tensors' shapes, and from them its parameter counts.

Read here rather than with gguf-py: PyPI's `gguf` refuses tensor types it does not know (ik_llama.cpp's own
quants, e.g. IQ4_KS, which the real MoE presets use), and only the shapes are needed, never the data.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

GGUF_MAGIC = b"GGUF"
# GGUF value types (ggml's gguf.h): the fixed-size ones with their struct codes; 8 string, 9 array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

Scalar = int | float | bool | str


class GgufError(ValueError):
    """Not a GGUF file this reader understands; the message says where it stopped and why."""


@dataclass(frozen=True)
class GgufHeader:
    version: int
    metadata: dict[str, Scalar]  # scalars and strings; an array is kept as its length
    tensors: dict[str, tuple[int, ...]]  # name -> shape (ggml order: the row length first)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str) -> int:
        """`<architecture>.<key>` as an integer; 0 when absent (e.g. expert_count of a dense model)."""
        value = self.metadata.get(f"{self.architecture}.{key}", 0)
        return int(value) if isinstance(value, int | float) else 0


@dataclass(frozen=True)
class ParamSplit:
    """A model's parameters in billions: all of them, and those one token uses."""

    total_b: float
    active_b: float
    experts: int
    experts_used: int

    @property
    def moe(self) -> bool:
        return self.experts > 0


class _Reader:
    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    def take(self, size: int) -> bytes:
        data = self.stream.read(size)
        if len(data) != size:
            raise GgufError(f"the file ends inside its header (wanted {size} bytes at {self.stream.tell()})")
        return data

    def unpack(self, code: str) -> Scalar:
        value: Scalar = struct.unpack("<" + code, self.take(struct.calcsize(code)))[0]
        return value

    def string(self) -> str:
        length = int(self.unpack("Q"))
        return self.take(length).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Scalar:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, count = int(self.unpack("I")), int(self.unpack("Q"))
            if inner in _SCALARS:  # skipped whole: a vocabulary's scores are 50k floats
                self.take(count * struct.calcsize(_SCALARS[inner]))
            else:
                for _ in range(count):
                    self.value(inner)
            return count
        raise GgufError(f"unknown GGUF value type {kind} at byte {self.stream.tell()}")


def read_header(stream: BinaryIO) -> GgufHeader:
    """The header of the GGUF file open in `stream` (version 2 or 3), read from its start."""
    reader = _Reader(stream)
    if reader.take(4) != GGUF_MAGIC:
        raise GgufError("not a GGUF file (its first bytes are not 'GGUF')")
    version = int(reader.unpack("I"))
    if version not in (2, 3):
        raise GgufError(f"GGUF version {version}: only versions 2 and 3 are read")
    tensor_count, kv_count = int(reader.unpack("Q")), int(reader.unpack("Q"))
    metadata: dict[str, Scalar] = {}
    for _ in range(kv_count):
        key = reader.string()
        metadata[key] = reader.value(int(reader.unpack("I")))
    tensors: dict[str, tuple[int, ...]] = {}
    for _ in range(tensor_count):
        name = reader.string()
        dims = int(reader.unpack("I"))
        tensors[name] = tuple(int(reader.unpack("Q")) for _ in range(dims))
        reader.take(4 + 8)  # the tensor's type and its offset in the data
    return GgufHeader(version=version, metadata=metadata, tensors=tensors)


def read_header_file(path: Path) -> GgufHeader:
    try:
        with path.open("rb") as handle:
            return read_header(handle)
    except GgufError as exc:
        raise GgufError(f"{path}: {exc}") from None


def param_split(header: GgufHeader) -> ParamSplit:
    """Routed expert tensors (`*_exps`: all experts of a layer stacked) count fully in the total and by
    `expert_used_count / expert_count` in the active parameters; everything else (attention, embeddings,
    routers, shared experts `*_shexp`, dense layers) counts fully in both. A model split over several GGUF
    files counts only the tensors of the file read."""
    experts, used = header.arch_value("expert_count"), header.arch_value("expert_used_count")
    total = routed = 0
    for name, shape in header.tensors.items():
        count = math.prod(shape)
        total += count
        if experts and "_exps." in name:
            routed += count
    active = total - routed + (routed * used / experts if experts else 0)
    return ParamSplit(total_b=total / 1e9, active_b=active / 1e9, experts=experts, experts_used=used)

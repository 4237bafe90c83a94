"""Other quantizations of the lanes' model, made once with ik_llama.cpp's own tools (embedded/ik_tools.py):
its converter makes an F16 GGUF of the Hugging Face model, its `llama-quantize` the rest from that."""

from __future__ import annotations

import json
from pathlib import Path

from lanes_pipeline.embedded.gguf_header import read_header_file
from lanes_pipeline.embedded.ik_tools import convert_to_gguf, quantize_gguf
from lanes_pipeline.embedded.moe_upcycle import converter_config

GGUF_MAGIC = b"GGUF"


def made_gguf_path(data_dir: Path, source: Path, quant: str) -> Path:
    return data_dir / "models" / f"{source.name}.{quant}.gguf"


def lacks_rope_base(gguf: Path, source: Path) -> bool:
    """A file made before the converter was given the rope base that transformers 5 keeps inside
    `rope_parameters`: the source has one, the GGUF none (the server then used llama's 10000)."""
    config = converter_config(json.loads((source / "config.json").read_text()))
    header = read_header_file(gguf)
    return "rope_theta" in config and f"{header.architecture}.rope.freq_base" not in header.metadata


def make_gguf(data_dir: Path, source: Path, quant: str) -> Path:
    """`<data>/models/<hf folder name>.<QUANT>.gguf`, made once from the HF folder `source` (again when the
    file there lacks the rope base)."""
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} is not a Hugging Face model folder (no config.json)")
    target = made_gguf_path(data_dir, source, quant)
    if target.is_file() and not lacks_rope_base(target, source):
        return target
    log_path = data_dir / "logs" / f"quantize-{source.name}.log"
    f16 = made_gguf_path(data_dir, source, "F16")
    if not f16.is_file() or lacks_rope_base(f16, source):
        convert_to_gguf(data_dir, source, f16, log_path)
    if quant != "F16":
        quantize_gguf(data_dir, f16, target, quant, log_path)
    return target


def check_model_file(path: Path, lane: str) -> None:
    """A CPU-lane model must be a GGUF file, a GPU-lane model an HF folder: name the wrong path and why."""
    if not path.exists():
        raise FileNotFoundError(f"model file {path} does not exist")
    if lane == "cpu":
        if not path.is_file():
            raise ValueError(f"model file {path} is not a file (the CPU lane needs a GGUF file)")
        with path.open("rb") as handle:
            if handle.read(4) != GGUF_MAGIC:
                raise ValueError(f"model file {path} is not GGUF (its first bytes are not 'GGUF')")
    elif not (path / "config.json").is_file():
        raise ValueError(f"model path {path} is not a Hugging Face model folder (no config.json)")

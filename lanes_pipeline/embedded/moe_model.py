"""The embedded CPU lane's mixture of experts: SmolLM2 upcycled (moe_upcycle.py), converted with
ik_llama.cpp's own converter and quantized with its `llama-quantize` (ik_tools.py), once per data folder,
beside the dense model in `<data>/models/`, with its log in `<data>/logs/build-<name>.log`.

`python -m lanes_pipeline.embedded.moe_model SOURCE TARGET --experts N [--noise X --seed S]` writes the
upcycled Hugging Face folder; it runs in a subprocess so the caller never holds the model's copies.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.ik_tools import convert_to_gguf, quantize_gguf, run_logged
from lanes_pipeline.embedded.moe_upcycle import MoeSpec, mixtral_config, upcycled_tensors
from lanes_pipeline.errors import EmbeddedStartError
from lanes_pipeline.settings import EmbeddedCpuServer, project_root

# Shards of about this many bytes: the checkpoint is written without holding all its copies at once.
SHARD_BYTES = 512 * 1024 * 1024
_NOT_COPIED = ("config.json", "model.safetensors.index.json")


def moe_gguf_path(data_dir: Path, spec: MoeSpec) -> Path:
    return data_dir / "models" / f"smollm2-135m-instruct-{spec.name}.{spec.quant}.gguf"


def write_upcycled(source: Path, target: Path, spec: MoeSpec) -> None:
    """The upcycled checkpoint of the Hugging Face folder `source` in `target`: config, sharded weights
    with their index, and the tokenizer files as they are."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    config = json.loads((source / "config.json").read_text())
    moe_config = mixtral_config(config, spec)
    weight_files = sorted(source.glob("*.safetensors"))
    if not weight_files:
        raise FileNotFoundError(f"{source} has no *.safetensors weights")
    dense = {}
    for path in weight_files:
        with safe_open(str(path), framework="np") as handle:
            dense |= {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    target.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    shard: dict[str, np.ndarray] = {}
    size = shards = 0

    def flush() -> None:
        nonlocal shard, size, shards
        if shard:
            shards += 1
            name = f"model-{shards:05d}.safetensors"
            save_file(shard, str(target / name), metadata={"format": "pt"})  # transformers wants "pt"
            weight_map.update(dict.fromkeys(shard, name))
            shard, size = {}, 0

    for name, tensor in upcycled_tensors(dense, moe_config, spec):
        shard[name] = tensor  # an expert's copies may be one array: each is written out on its own
        size += tensor.nbytes
        if size >= SHARD_BYTES:
            flush()
    flush()
    total = sum((target / f).stat().st_size for f in set(weight_map.values()))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (target / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (target / "config.json").write_text(json.dumps(moe_config, indent=2))
    for item in source.iterdir():
        if item.is_file() and item.name not in _NOT_COPIED and item.suffix != ".safetensors":
            shutil.copy2(item, target / item.name)  # the tokenizer, chat template, generation config


def upcycled_moe_gguf(data_dir: Path, spec: MoeSpec) -> Path:
    """The upcycled model as a GGUF file, built once (upcycle, convert to F16, quantize unless F16 is asked
    for); a step that fails
    raises with that tool's own last lines (a model the converter cannot convert: the converter's message)
    and the log's path."""
    target = moe_gguf_path(data_dir, spec)
    if target.is_file():
        return target
    source = engines.embedded_hf_model(data_dir)
    log_path = data_dir / "logs" / f"build-{target.stem}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with engines._install_lock(f"build-{target.stem}"):
        if target.is_file():
            return target
        print(f"[lanes] building the {spec.name} model (once, a few minutes); log: {log_path}", flush=True)
        work = target.parent / f".build-{target.stem}"
        shutil.rmtree(work, ignore_errors=True)  # what a killed build left
        work.mkdir(parents=True)
        try:
            checkpoint, f16 = work / "hf", work / "model.F16.gguf"
            command = [
                sys.executable,
                "-m",
                "lanes_pipeline.embedded.moe_model",
                str(source),
                str(checkpoint),
            ]
            command += ["--experts", str(spec.experts), "--noise", str(spec.noise), "--seed", str(spec.seed)]
            run_logged(command, log_path, f"upcycling {source} into {spec.name}")
            if spec.quant == "F16":
                convert_to_gguf(data_dir, checkpoint, target, log_path)
            else:
                convert_to_gguf(data_dir, checkpoint, f16, log_path)
                quantize_gguf(data_dir, f16, target, spec.quant, log_path, spec.quantize_options())
        finally:
            shutil.rmtree(work, ignore_errors=True)  # the checkpoint and the F16 file: only the GGUF stays
    return target


def embedded_cpu_gguf(embedded: EmbeddedCpuServer, data_dir: Path) -> Path:
    """The GGUF file the embedded CPU lane serves: the user's own (`gguf`), else the shipped dense model or
    the upcycled MoE (`model`)."""
    if embedded.gguf is not None:
        path = Path(embedded.gguf).expanduser()
        path = path if path.is_absolute() else project_root() / path
        if not path.is_file():
            raise EmbeddedStartError(
                f"cpu_lane.embedded.gguf in lanes.yaml: {path} is not a file (download the model there "
                "first: nothing downloads it)",
                log_path=None,
                tail="",
            )
        return path
    if embedded.model == "moe":
        return upcycled_moe_gguf(data_dir, MoeSpec(experts=embedded.moe_experts))
    return engines.embedded_gguf(data_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Upcycle a dense Llama checkpoint into a Mixtral-style MoE.")
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--experts", type=int, required=True)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    spec = MoeSpec(experts=args.experts, noise=args.noise, seed=args.seed)
    write_upcycled(args.source, args.target, spec)
    print(f"upcycled {args.source} -> {args.target} ({spec.name})")


if __name__ == "__main__":
    main()

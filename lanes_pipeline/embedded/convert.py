"""Convert a GGUF model to a Hugging Face folder: `python -m lanes_pipeline.embedded.convert GGUF OUT`.

Runs in a subprocess so the caller never holds the model. transformers can load a GGUF (dequantized) but
refuses to save a model loaded that way, so we rebuild a plain model from its config and state dict.
The folder is written next to the target and renamed into place: a killed conversion leaves nothing half.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path


def convert(gguf_path: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(f"converted {gguf_path} -> {target}")


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]))

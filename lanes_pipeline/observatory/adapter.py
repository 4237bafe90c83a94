"""A small PEFT LoRA adapter with random weights, made once: what serving through an adapter costs does not
depend on what the adapter learned, and a random one is made in seconds instead of trained."""

from __future__ import annotations

from pathlib import Path


def random_adapter(base_model_dir: Path, out_dir: Path, rank: int, seed: int = 0) -> Path:
    """`out_dir` holding adapter_config.json + adapter_model.safetensors (all seven Llama projections)."""
    if (out_dir / "adapter_config.json").is_file():
        return out_dir
    import torch  # heavy: only when an adapter is actually made
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        init_lora_weights=False,  # random A and B: the adapter is really applied, not a zero delta
        task_type="CAUSAL_LM",
    )
    partial = out_dir.with_name(out_dir.name + ".partial")
    get_peft_model(model, config).save_pretrained(str(partial))
    partial.rename(out_dir)
    return out_dir

"""The torch side of the trainer process: device and dtype, seeding, tokenizer, the PEFT model, and the loss
on assistant tokens. Imported only in the trainer process (torch, transformers and PEFT load here)."""

from __future__ import annotations

import random
import resource
from collections.abc import Sequence
from typing import Any

from lanes_pipeline.gpu_lane.training.data import IGNORE, Collated, Example, encode_row
from lanes_pipeline.settings import LoraSettings, TrainingConfig


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def pick_device(requested: str) -> tuple[Any, Any]:
    """CUDA when asked or available, with bf16 where the GPU supports it; otherwise the CPU in fp32."""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device 'cuda' was asked for, but torch {torch.__version__} sees no CUDA device")
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.device("cuda"), dtype
    return torch.device("cpu"), torch.float32


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def load_tokenizer(base_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_rows(tokenizer: Any, rows: Sequence[dict[str, Any]], max_len: int) -> tuple[list[Example], int]:
    examples, dropped = [], 0
    for row in rows:
        example = encode_row(tokenizer, row, max_len)
        if example is None:
            dropped += 1
        else:
            examples.append(example)
    return examples, dropped


def tensors(batch: Collated, device: Any) -> dict[str, Any]:
    import torch

    tensors = {
        "input_ids": torch.tensor(batch.input_ids, device=device),
        "labels": torch.tensor(batch.labels, device=device),
        "position_ids": torch.tensor(batch.position_ids, device=device),
    }
    if batch.attention_mask is not None:
        tensors["attention_mask"] = torch.tensor(batch.attention_mask, device=device)
    return tensors


def assistant_loss(model: Any, tensors: dict[str, Any], num_items: int) -> Any:
    """Summed cross-entropy over the labelled (assistant) positions, divided by `num_items` (the labelled
    tokens of the whole accumulation group, so micro-batches add up to the group's mean).

    The vocabulary projection runs on the labelled positions only: with a 49k vocabulary it is a fifth of
    a small model's compute, and its logits are the largest activation; the loss is the same as the
    model's own (test_training_process checks it)."""
    import torch

    labels = tensors.pop("labels")
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = causal.model(**tensors).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != IGNORE
    logits = causal.lm_head(hidden[:, :-1][keep]).float()
    return torch.nn.functional.cross_entropy(logits, targets[keep], reduction="sum") / num_items


def shifted_label_count(batch: Collated) -> int:
    # The model predicts token t+1 from token t: the first label of every row is never scored.
    return sum(1 for row in batch.labels for label in row[1:] if label != IGNORE)


def peft_model(
    base_model_dir: str, training: TrainingConfig, device: Any, dtype: Any, init_adapter: str | None = None
) -> Any:
    """The base model with a trainable LoRA: a fresh one, or `init_adapter`'s weights to train on."""
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=dtype).to(device)
    model.config.use_cache = False
    if training.gradient_checkpointing:  # activations recomputed in backward: less memory, more compute
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if init_adapter is not None:
        return PeftModel.from_pretrained(model, init_adapter, is_trainable=True)
    return get_peft_model(model, lora_config(training.lora))


def lora_config(lora: LoraSettings) -> Any:
    from peft import LoraConfig

    # bias "none", no modules_to_save, no DoRA: what vLLM serves (checked again before any load).
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def peak_accelerator_mb(device: Any) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)

"""What a llama-server says at start about the settings it took: read back from its log, so that a flag is
known to have taken effect, not only to have been passed. ik_llama.cpp prints its context settings once
(`llama_init_from_model: fused_moe = 1`, `ser = 1, 0.5`, `attn_max_b = 512`), the tensors `-ot` placed
(`Tensor blk.0.ffn_up_exps.weight (size = ...) buffer type overriden to CPU`) and what `-rtr` repacked
(`============ Repacked 120 tensors`) and the model's experts (`n_expert = 4`). Upstream llama-server prints
none of these at its default verbosity: what it took is not read back.
"""

from __future__ import annotations

import re

# The first match of each: every one is printed once, while the model loads.
_SETTINGS = {
    "n_expert": re.compile(r"\bn_expert\s*=\s*(\d+)"),
    "n_expert_used": re.compile(r"\bn_expert_used\s*=\s*(\d+)"),
    "flash_attn": re.compile(r"\bflash_attn\s*=\s*(\S+)"),
    "fused_moe": re.compile(r"\bfused_moe\s*=\s*(\d+)"),
    "ser": re.compile(r"\bser\s*=\s*(-?\d+,\s*[-+\d.e]+)"),
    "attn_max_batch": re.compile(r"\battn_max_b\s*=\s*(\d+)"),
    "repacked_tensors": re.compile(r"Repacked (\d+) tensors"),
}
_OVERRIDDEN = re.compile(r"(?i)tensor (\S+) \(.*\) buffer type overrid+en to (\S+)")


def read_back(log_text: str) -> dict[str, str]:
    """The settings the server reported, by name (only those it printed), and `overridden_tensors`: how
    many tensors `-ot` placed where (e.g. `90 to CPU`)."""
    found = {
        name: match.group(1) for name, pattern in _SETTINGS.items() if (match := pattern.search(log_text))
    }
    placed: dict[str, int] = {}
    for _tensor, buffer in _OVERRIDDEN.findall(log_text):
        placed[buffer] = placed.get(buffer, 0) + 1
    if placed:
        found["overridden_tensors"] = ", ".join(
            f"{count} to {buffer}" for buffer, count in sorted(placed.items())
        )
    return found

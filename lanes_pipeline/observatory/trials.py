"""Running one trial: start its server (an embedded engine with the trial's model file and flags, or the
user's own command template) on a free port, measure it with the lane benchmark, record the figures and the
exact command line in the registry, and stop the server, whatever happens.

A server that does not start is a recorded failure with its log tail, not an exception: `lanes trial run`
and the benchmark go on with the next trial.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import httpx

from lanes_pipeline.config.trials import MOE_FILE, TrialSpec
from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.engine_log import read_back
from lanes_pipeline.embedded.gguf_header import GgufError, param_split, read_header_file
from lanes_pipeline.embedded.moe_model import upcycled_moe_gguf
from lanes_pipeline.embedded.moe_upcycle import MoeSpec
from lanes_pipeline.embedded.servers import (
    EmbeddedServer,
    ServerCommand,
    build_server,
    choose_port,
    llama_server_command,
    running_embedded_url,
    vllm_server_command,
)
from lanes_pipeline.errors import EmbeddedStartError, LaneError, log_tail
from lanes_pipeline.observatory.adapter import random_adapter
from lanes_pipeline.observatory.benchmark import lane_target
from lanes_pipeline.observatory.interference import measure_interference
from lanes_pipeline.observatory.measure import LaneName, LaneTarget, measure_lane
from lanes_pipeline.observatory.quantize import check_model_file, make_gguf
from lanes_pipeline.observatory.registry import ModelParams, TrialRecord
from lanes_pipeline.observatory.workload import Workload
from lanes_pipeline.settings import Settings

OtherLane = Literal["none", "running", "start"]
ADAPTER_NAME = "trial-adapter"


def registered_params(settings: Settings, model: str, source: str = "models.yaml") -> ModelParams:
    """A model's parameters as models.yaml gives them."""
    entry = next((m for m in settings.models.models if m.name == model), None)
    if entry is None:
        raise LaneError(f"trial model {model!r} is not a model in configs/models.yaml")
    return ModelParams(
        moe=entry.arch == "moe",
        active_params_b=entry.active_params_b or entry.params_b,
        total_params_b=entry.params_b,
        source=source,
    )


def model_params(spec: TrialSpec, settings: Settings, path: Path) -> ModelParams:
    """What the served file holds: a GGUF's own tensors (all of them, and those a token uses: the routed
    experts by expert_used_count / expert_count), else (an HF folder, a GGUF split in parts, a header this
    reader does not know, which `source` names) models.yaml."""
    if spec.lane != "cpu" or not path.is_file():
        return registered_params(settings, spec.model)
    try:
        header = read_header_file(path)
    except GgufError as exc:
        return registered_params(settings, spec.model, f"models.yaml ({exc})")
    if int(header.metadata.get("split.count", 1) or 1) > 1:
        return registered_params(settings, spec.model, "models.yaml (a GGUF split in parts)")
    split = param_split(header)
    return ModelParams(
        moe=split.moe, active_params_b=split.active_b, total_params_b=split.total_b, source="gguf"
    )


def engine_label(spec: TrialSpec, settings: Settings) -> str:
    if spec.command is not None:
        return "own command"
    if spec.lane == "gpu":
        return "vllm"
    return spec.cpu.engine or settings.lanes.cpu_lane.embedded.engine


def quant_label(spec: TrialSpec, settings: Settings) -> str:
    """The table's quant column; a GPU trial served through an adapter says so (its cost is the point)."""
    if spec.quant:
        label = spec.quant
    elif spec.made_quant:
        label = spec.made_quant
    else:
        entry = next((m for m in settings.models.models if m.name == spec.model), None)
        label = entry.quantization if entry else "?"
    if spec.lane == "gpu" and spec.gpu.adapter == "random":
        label += f" + LoRA r{spec.gpu.adapter_rank}"
    return label


def trial_folder(data_dir: Path, name: str) -> Path:
    """Where a trial's server log goes (`logs/<lane>-lane-server-<port>.log`), apart from the lanes' own."""
    return data_dir / "observatory" / "trials" / name


def model_path(spec: TrialSpec, settings: Settings) -> Path:
    """The model file the trial serves, made first when it is `made:<QUANT>`; checked to be GGUF / HF."""
    data = settings.data_dir
    if spec.file == "embedded":
        path = engines.embedded_gguf(data) if spec.lane == "cpu" else engines.embedded_hf_model(data)
    elif spec.file == MOE_FILE:
        path = upcycled_moe_gguf(data, MoeSpec(experts=settings.lanes.cpu_lane.embedded.moe_experts))
    elif spec.made_quant is not None:
        path = make_gguf(data, engines.embedded_hf_model(data), spec.made_quant)
    else:
        path = Path(spec.file).expanduser()
        path = path if path.is_absolute() else settings.project_root / path
    check_model_file(path, spec.lane)
    return path


def _replace(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def server_command(spec: TrialSpec, settings: Settings, port: int) -> tuple[ServerCommand, str]:
    """The trial's server command and the model name its requests carry."""
    path = model_path(spec, settings)
    if spec.command is not None:
        argv = [part.format(port=port, model=path) for part in spec.command]
        return ServerCommand(spec.lane, argv, {}, port, "/v1/models"), _served_name(spec, settings)
    if spec.lane == "cpu":
        lane = settings.lanes.cpu_lane
        chosen = {"parallel": spec.cpu.slots, "ctx_size": spec.cpu.ctx_size}
        flags = {key: value for key, value in chosen.items() if value is not None} | {
            "threads": spec.cpu.threads
        }
        # The trial's extra_args replace the lane's (a trial is one exact launch), as the lane's own, so the
        # engine's defaults yield to them (ik gets -fa off unless the trial sets flash attention itself).
        flags |= {"extra_args": spec.extra_args, **({"engine": spec.cpu.engine} if spec.cpu.engine else {})}
        embedded = lane.embedded.model_copy(update=flags)
        command = llama_server_command(
            lane.model_copy(update={"embedded": embedded}), settings.data_dir, port
        )
        command.argv = _replace(command.argv, "-m", str(path))
        return command, lane.model_alias
    gpu = settings.lanes.gpu_lane
    chosen = {"dtype": spec.gpu.dtype, "max_model_len": spec.gpu.max_model_len}
    embedded = gpu.embedded.model_copy(update={k: v for k, v in chosen.items() if v is not None})
    rank = spec.gpu.max_lora_rank if spec.gpu.max_lora_rank is not None else gpu.max_lora_rank
    lane = gpu.model_copy(update={"embedded": embedded, "max_lora_rank": rank})
    command = vllm_server_command(lane, settings.data_dir, port)
    command.argv = _replace(command.argv, "--model", str(path))
    command.argv += ["--max-num-seqs", str(spec.gpu.max_num_seqs)]
    served = lane.served_model_name
    if spec.gpu.adapter == "random":
        folder = (
            settings.data_dir / "observatory" / "adapters" / f"random-r{spec.gpu.adapter_rank}-{path.name}"
        )
        adapter = random_adapter(path, folder, spec.gpu.adapter_rank)
        command.argv += ["--lora-modules", f"{ADAPTER_NAME}={adapter}"]
        served = ADAPTER_NAME  # every request goes through the adapter
    command.argv += spec.extra_args
    return command, served


def _served_name(spec: TrialSpec, settings: Settings) -> str:
    return (
        settings.lanes.cpu_lane.model_alias
        if spec.lane == "cpu"
        else settings.lanes.gpu_lane.served_model_name
    )


def _other_lane_target(
    settings: Settings, lane: LaneName, mode: OtherLane, stack: ExitStack
) -> LaneTarget | None:
    """The other lane, for interference: one already running (embedded by us, or external), or started."""
    if mode == "none":
        return None
    config = settings.lanes.cpu_lane if lane == "cpu" else settings.lanes.gpu_lane
    url = config.base_url if not config.is_embedded else running_embedded_url(settings.data_dir, lane)
    if url is None and mode == "start":
        server = build_server(settings, lane, port=0, publish=False)
        stack.callback(server.stop)
        url = server.start().url
    return None if url is None else lane_target(settings, lane, url)


@contextmanager
def _started(server: EmbeddedServer) -> Iterator[EmbeddedServer]:
    try:
        yield server.start()
    finally:
        server.stop()  # a trial never leaves a server running: start() failing stops it too


def run_trial(
    spec: TrialSpec, settings: Settings, work: Workload, other: OtherLane = "running"
) -> TrialRecord:
    started = datetime.now(UTC).isoformat(timespec="seconds")
    clock = time.perf_counter()
    base = {
        "name": spec.name,
        "lane": spec.lane,
        "engine": engine_label(spec, settings),
        "model": spec.model,
        "quant": quant_label(spec, settings),
        "threads": spec.cpu.threads if spec.lane == "cpu" else None,
        "slots": spec.slots(settings.lanes),
        "started": started,
    }
    command_line = ""
    folder = trial_folder(settings.data_dir, spec.name)
    server: EmbeddedServer | None = None
    params: ModelParams | None = None
    try:
        config = settings.lanes.cpu_lane if spec.lane == "cpu" else settings.lanes.gpu_lane
        port = choose_port(spec.lane, 0)
        command, served = server_command(spec, settings, port)
        params = model_params(spec, settings, model_path(spec, settings))
        command_line = shlex.join(command.argv)
        server = EmbeddedServer(command, folder, config.ready_timeout_s, publish=False)
        with ExitStack() as stack:
            running = stack.enter_context(_started(server))
            read = read_back(server.log_path.read_text(errors="replace"))
            target = LaneTarget(
                lane=spec.lane,
                url=running.url,
                model=served,
                slots=spec.slots(settings.lanes),
                active_params_b=params.active_params_b,
                api_key=config.api_key(),
            )
            figures = measure_lane(target, work)
            other_lane: LaneName = "gpu" if spec.lane == "cpu" else "cpu"
            other_target = _other_lane_target(settings, other_lane, other, stack)
            detail = None
            if other_target is not None:
                cpu, gpu = (target, other_target) if spec.lane == "cpu" else (other_target, target)
                detail = measure_interference(cpu, gpu, work, settings.lanes.bandwidth)
        return TrialRecord(
            **base,
            command=command_line,
            ok=True,
            wall_s=round(time.perf_counter() - clock, 1),
            figures=figures,
            params=params,
            read_back=read,
            interference=detail.for_lane(spec.lane) if detail else None,
            interference_detail=detail,
        )
    except EmbeddedStartError as exc:
        failure, tail = str(exc).splitlines()[0], exc.tail or log_tail(exc.log_path)
    except (RuntimeError, OSError, ValueError, httpx.HTTPError) as exc:  # LaneError is a RuntimeError
        failure, tail = (
            f"{type(exc).__name__}: {exc}",
            log_tail(server.log_path) if server is not None else "",
        )
    return TrialRecord(
        **base,
        command=command_line,
        ok=False,
        wall_s=round(time.perf_counter() - clock, 1),
        params=params,
        error=failure,
        log_tail=tail or None,
    )

"""The GPU lane's daily adapter: train it (lora_adapter), judge it (adapter_evaluation), serve it
(served_adapter). The work is in `training/`, `adapter_serving.py` and `evaluation.py`; these assets
orchestrate it and record what happened as metadata and in the version registry."""

import base64
import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource
from lanes_pipeline.gpu_lane.adapters import (
    IncompatibleAdapterError,
    Version,
    check_adapter_dir,
    check_lora_config,
    next_version_name,
    supported_target_modules,
)
from lanes_pipeline.gpu_lane.client import VllmClient, asleep
from lanes_pipeline.gpu_lane.evaluation import Figures as EvalFigures
from lanes_pipeline.gpu_lane.evaluation import TaskScore, promotion_decision, task_score
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource, LoraTrainingResource
from lanes_pipeline.gpu_lane.serving import AdapterService
from lanes_pipeline.gpu_lane.training.runner import TrainingError, run_evaluation, run_training
from lanes_pipeline.gpu_lane.training.spec import LOSS_CURVE, EvalSpec, TrainSpec, TrainSummary
from lanes_pipeline.gpu_lane.training_window import dataset_root, fingerprint, load_split, window_dirs
from lanes_pipeline.host import with_host_figures
from lanes_pipeline.settings import TrainingConfig, data_dir

GROUP, POOL = "gpu_lane", "gpu_lane"
LORA_DATASET = AssetKey("lora_dataset")


def _day(context: AssetExecutionContext) -> date:
    return date.fromisoformat(context.partition_key)


def service_for(
    gpu_lane: GpuLaneResource,
    registry: AdapterRegistryResource,
    training: LoraTrainingResource,
    client: VllmClient,
) -> AdapterService:
    return AdapterService(
        client=client,
        registry=registry.registry(),
        base_model=gpu_lane.served_model_name,
        alias=gpu_lane.alias_name,
        max_loaded=gpu_lane.max_loaded_versions,
        max_lora_rank=gpu_lane.max_lora_rank,
        supported_modules=supported_target_modules(training.base_model_path()),
    )


def _day_candidate(registry: AdapterRegistryResource, day: date) -> Version:
    versions = registry.registry().versions(day)
    if not versions:
        raise Failure(f"no adapter version for {day}: materialize lora_adapter for this partition first")
    return versions[-1]


def _relay(context: AssetExecutionContext) -> Any:
    """Trainer events to the Dagster log: every step of a short run, about 50 lines of a long one."""

    def on_event(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "step":
            every = max(1, int(event.get("total_steps", 1)) // 50)
            if event["step"] % every == 0 or event["step"] == event.get("total_steps"):
                context.log.info(
                    f"step {event['step']}/{event['total_steps']} loss {event['loss']:.4f} "
                    f"{event['tokens_per_s']:.0f} tok/s ({event['elapsed_s']:.0f} s)"
                )
        elif kind in ("start", "eval"):
            context.log.info(
                f"trainer {kind}: {json.dumps({k: v for k, v in event.items() if k != 'event'})}"
            )

    return on_event


def _png_markdown(path: Path) -> MetadataValue:
    encoded = base64.b64encode(path.read_bytes()).decode("ascii")
    return MetadataValue.md(f"![loss curve](data:image/png;base64,{encoded})")


def _training_metadata(version: Version, summary: TrainSummary, reused: bool) -> dict[str, Any]:
    path = Path(version.path)
    return {
        "version": version.name,
        "path": MetadataValue.path(str(path)),
        "reused_existing_version": reused,
        "steps": summary.steps,
        "samples": summary.samples,
        "tokens": summary.tokens,
        "trained_tokens": summary.trained_tokens,
        "tokens_per_s": summary.tokens_per_s,
        "train_s": summary.train_s,
        "wall_s": summary.wall_s,
        "peak_rss_mb": summary.peak_rss_mb,
        "peak_accelerator_mb": summary.peak_accelerator_mb or 0.0,
        "final_loss": summary.final_loss,
        "device": summary.device,
        "loss_curve": _png_markdown(path / LOSS_CURVE),
    }


@asset(
    group_name=GROUP,
    pool=POOL,
    retry_policy=LANE_RETRY,
    deps=[LORA_DATASET],
    # A window without a single training row yields nothing: evaluation and serving are skipped, the alias
    # stays where it is, and the run still succeeds (a quiet day is not an error).
    output_required=False,
    description="PEFT LoRA trained in a subprocess on the window of lora_dataset days; a new version folder.",
)
@with_host_figures
def lora_adapter(
    context: AssetExecutionContext,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
    artifact_store: ArtifactStoreResource,
) -> Iterator[MaterializeResult]:
    day, config = _day(context), lora_training.config()
    artifacts = artifact_store.store().root
    dirs = window_dirs(artifacts, day, config.replay_window_days)
    if not dirs:
        raise Failure(
            f"no lora_dataset partition in the {config.replay_window_days} days up to {day} under "
            f"{dataset_root(artifacts)}: materialize lora_dataset first"
        )
    rows = len(load_split(dirs, "train"))
    if rows == 0:
        context.log.warning(f"no training rows in {', '.join(d.name for d in dirs)}: no adapter for {day}")
        return
    base_dir = lora_training.base_model_path()
    supported = supported_target_modules(base_dir)
    planned = {
        "r": config.lora.r,
        "lora_alpha": config.lora.alpha,
        "target_modules": config.lora.target_modules,
    }
    issues = check_lora_config(planned, gpu_lane.max_lora_rank, supported)
    if issues:  # before hours of training, not after
        raise IncompatibleAdapterError(f"planned by configs/training.yaml for {day}", issues)
    registry = adapter_registry.registry()
    inputs = json.dumps(
        {"data": fingerprint(dirs), "training": config.model_dump(mode="json"), "base": str(base_dir)},
        sort_keys=True,
    )
    inputs_hash = hashlib.sha256(inputs.encode()).hexdigest()
    existing = registry.find(day, inputs_hash)
    if existing is not None and Path(existing.path).is_dir():
        context.log.info(f"{existing.name} was trained on exactly these inputs: reusing it")
        summary = TrainSummary.model_validate(existing.training)
        yield MaterializeResult(metadata=_training_metadata(existing, summary, reused=True))
        return

    folder = adapter_registry.folder()
    taken = [v.name for v in registry.versions()] + [p.name for p in folder.glob("*") if p.is_dir()]
    name = next_version_name(gpu_lane.adapter_prefix, day, taken)
    spec = TrainSpec.from_config(
        config, str(base_dir), [str(d) for d in dirs], str(folder / name), device=lora_training.device
    )
    waited = gpu_lane.wait_for_quiet_cpu_lane(
        on_busy=lambda n: context.log.info(f"waiting: the CPU lane has {n:g} request(s) in progress")
    )
    if waited is not None and not waited.quiet:
        raise Failure(
            f"the CPU lane stayed busy for {waited.waited_s:.0f} s: training would fight it for memory "
            "bandwidth (bandwidth.training_wait_max_s in configs/lanes.yaml); the step is retried later"
        )
    context.log.info(f"training {name} on {len(dirs)} day(s) of data: {', '.join(d.name for d in dirs)}")
    freeing_gpu = gpu_lane.sleep_mode and _trains_on_cuda(lora_training.device)
    log_path = data_dir() / "logs" / f"training-{name}.log"
    try:
        with _gpu_asleep(gpu_lane) if freeing_gpu else nullcontext():
            summary = run_training(spec, _relay(context), log_path)
    except TrainingError as exc:
        # A trainer that raised will raise again (data, device, config): no retry; a killed one may not.
        raise Failure(str(exc), allow_retries=exc.transient) from exc
    check_adapter_dir(folder / name, gpu_lane.max_lora_rank, supported)
    version = registry.add(name, day, folder / name, inputs_hash, summary.model_dump(mode="json"))
    context.log.info(
        f"{name}: {summary.steps} steps, final loss {summary.final_loss:.4f}, {summary.tokens_per_s} tok/s"
    )
    waited_s = waited.waited_s if waited is not None else 0.0
    yield MaterializeResult(
        metadata={**_training_metadata(version, summary, reused=False), "waited_for_cpu_lane_s": waited_s}
    )


def _trains_on_cuda(device: str) -> bool:
    if device != "auto":
        return device == "cuda"
    import torch  # only to ask; the model is loaded by the trainer process

    return torch.cuda.is_available()


def _gpu_asleep(gpu_lane: GpuLaneResource) -> Any:
    return asleep(gpu_lane.vllm(), level=1)


def _task_scores(client: VllmClient, models: dict[str, str]) -> dict[str, TaskScore]:
    """label -> score of the served model name; the prompts of the three models run side by side."""
    with ThreadPoolExecutor(max_workers=len(models)) as pool:
        futures = {label: pool.submit(task_score, client, served) for label, served in models.items()}
        return {label: future.result() for label, future in futures.items()}


@dataclass
class Measured:
    """What adapter_evaluation measures for one candidate: the expensive part (an eval-loss subprocess and
    task-score requests through vLLM). The promotion decision is a pure function of it."""

    current: str | None  # the promoted version the candidate was measured against
    figures: dict[str, EvalFigures]
    scores: dict[str, TaskScore]


def _measurement_inputs(config: TrainingConfig) -> dict[str, Any]:
    """The settings the figures depend on besides the candidate itself (its training inputs fix its data
    window, thus the held-out split): the same inputs give the same figures, so they are not measured
    again."""
    return {"eval_max_samples": config.eval_max_samples, "max_seq_len": config.max_seq_len}


def _recorded(candidate: Version, inputs: dict[str, Any]) -> Measured | None:
    evaluation = candidate.evaluation
    if evaluation.get("measured_with") != inputs:
        return None
    return Measured(
        current=evaluation["current"],
        figures={label: EvalFigures.model_validate(f) for label, f in evaluation["figures"].items()},
        scores={label: TaskScore.model_validate(s) for label, s in evaluation["task_scores"].items()},
    )


def _measure(
    context: AssetExecutionContext,
    candidate: Version,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
    dirs: list[Path],
) -> Measured:
    config, registry = lora_training.config(), adapter_registry.registry()
    current = next(
        (
            registry.get(m.version)
            for m in reversed(registry.alias_history(gpu_lane.alias_name))
            if m.version != candidate.name
        ),
        None,
    )
    adapters = {candidate.name: candidate.path} | ({current.name: current.path} if current else {})
    spec = EvalSpec(
        base_model_dir=str(lora_training.base_model_path()),
        dataset_dirs=[str(d) for d in dirs],
        adapters=adapters,
        max_samples=config.eval_max_samples,
        max_seq_len=config.max_seq_len,
        device=lora_training.device,
        seed=config.seed,
    )
    log_path = data_dir() / "logs" / f"eval-{candidate.name}.log"
    losses = {r.model: r.loss for r in run_evaluation(spec, _relay(context), log_path)}

    with gpu_lane.vllm() as client:
        service = service_for(gpu_lane, adapter_registry, lora_training, client)
        served = {"base": gpu_lane.served_model_name, "candidate": candidate.name}
        service.ensure_loaded(candidate)
        if current is not None:
            service.ensure_loaded(current)
            served["current"] = current.name
        scores = _task_scores(client, served)
    figures = {
        "base": EvalFigures(eval_loss=losses["base"], task_score=scores["base"].score),
        "candidate": EvalFigures(eval_loss=losses[candidate.name], task_score=scores["candidate"].score),
    }
    if current is not None:
        figures["current"] = EvalFigures(eval_loss=losses[current.name], task_score=scores["current"].score)
    return Measured(current.name if current else None, figures, scores)


@asset(
    group_name=GROUP,
    pool=POOL,
    retry_policy=LANE_RETRY,
    deps=[lora_adapter],
    description="Eval loss (held-out split) and a coding task score for base, current and candidate.",
)
@with_host_figures
def adapter_evaluation(
    context: AssetExecutionContext,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
    artifact_store: ArtifactStoreResource,
) -> MaterializeResult:
    day, config = _day(context), lora_training.config()
    registry = adapter_registry.registry()
    candidate = _day_candidate(adapter_registry, day)
    store = artifact_store.store()
    inputs = _measurement_inputs(config)
    # A re-run of the day (or a backfill over it) judges the figures already measured: the day's verdict
    # stands against the version that was current then, and the lanes are not asked again.
    measured = _recorded(candidate, inputs)
    reused = measured is not None
    if measured is None:
        dirs = window_dirs(store.root, day, config.replay_window_days)
        measured = _measure(context, candidate, gpu_lane, lora_training, adapter_registry, dirs)
    else:
        context.log.info(f"{candidate.name} was measured with these settings already: 0 requests")
    figures = measured.figures
    decision = promotion_decision(
        figures["candidate"],
        figures["base"],
        figures.get("current"),
        config.eval_loss_margin,
        config.task_score_tolerance,
    )
    evaluation = {
        "candidate": candidate.name,
        "current": measured.current,
        "figures": {label: f.model_dump() for label, f in figures.items()},
        "task_scores": {label: s.model_dump() for label, s in measured.scores.items()},
        "eval_samples": config.eval_max_samples,
        "loss_margin": config.eval_loss_margin,
        "task_score_tolerance": config.task_score_tolerance,
        "measured_with": inputs,
        "decision": decision.model_dump(),
    }
    registry.record_evaluation(candidate.name, evaluation)
    if not decision.promote and candidate.status == "candidate":
        registry.set_status(candidate.name, "rejected")
    store.write_json("adapter_evaluation", context.partition_key, "evaluation.json", evaluation)
    verdict = "promote" if decision.promote else "reject"
    context.log.info(f"{candidate.name}: {verdict}: " + "; ".join(decision.reasons))
    metadata: dict[str, Any] = {
        "candidate": candidate.name,
        "current": measured.current or "none",
        "promote": decision.promote,
        "reused_measurements": reused,
        "reasons": MetadataValue.md("\n".join(f"- {r}" for r in decision.reasons)),
    }
    for label, f in figures.items():
        metadata[f"{label}_eval_loss"] = f.eval_loss
        metadata[f"{label}_task_score"] = f.task_score
    return MaterializeResult(metadata=metadata)


@asset(
    group_name=GROUP,
    pool=POOL,
    retry_policy=LANE_RETRY,
    deps=[adapter_evaluation],
    description="The day's adapter loaded into vLLM under its version name; the stable alias moved to it if "
    "it passed evaluation.",
)
@with_host_figures
def served_adapter(
    context: AssetExecutionContext,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
) -> MaterializeResult:
    day = _day(context)
    candidate = _day_candidate(adapter_registry, day)
    decision = candidate.evaluation.get("decision")
    if decision is None:
        raise Failure(
            f"{candidate.name} has not been evaluated: materialize adapter_evaluation for {day} first"
        )
    # The day's promotion happens once: a re-run (or a backfill over the day after later days moved the
    # alias, or after a rollback) leaves the alias where it is instead of moving it back to this version.
    report = None
    with gpu_lane.vllm() as client:
        service = service_for(gpu_lane, adapter_registry, lora_training, client)
        history = service.registry.alias_history(gpu_lane.alias_name)
        earlier = [m for m in history if m.version == candidate.name]
        if decision["promote"] and not earlier:
            report = service.promote(candidate, reason=f"daily {day}")
            context.log.info(
                f"{report.alias} -> {report.version} in {report.seconds:.2f} s "
                f"(smoke answer {report.smoke_answer!r})"
            )
        else:
            restored = service.restore()  # keep what was served, even across a restart
            why = f"was promoted at {earlier[0].moved_at} already" if decision["promote"] else "was rejected"
            context.log.info(
                f"{candidate.name} {why}; {gpu_lane.alias_name} stays"
                + (f" (restored {', '.join(restored)})" if restored else "")
            )
        target = service.registry.alias_target(gpu_lane.alias_name)
        loaded = sorted(service.loaded())
    metadata: dict[str, Any] = {
        "candidate": candidate.name,
        "promoted": bool(decision["promote"]),
        "alias": gpu_lane.alias_name,
        "alias_target": target.name if target else "none",
        "loaded_adapters": MetadataValue.json(loaded),
        "url": MetadataValue.url(client.base_url),
    }
    metadata["alias_moved"] = report is not None
    if report is not None:
        metadata["alias_move_s"] = round(report.seconds, 3)
        metadata["unloaded"] = MetadataValue.json(report.unloaded)
    return MaterializeResult(metadata=metadata)

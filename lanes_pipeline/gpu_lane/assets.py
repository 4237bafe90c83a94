"""The GPU lane's daily adapter: train it (lora_adapter), judge it (adapter_evaluation), serve it
(served_adapter). The work is in `training/`, `measurement.py`, `promotion.py` and `serving.py`; these
assets orchestrate it and record what happened as metadata and in the version registry.

A day never fails for want of data: a window with too few training rows trains no adapter, and all three
assets materialize with "no adapter today" and why (asking vLLM nothing); a candidate with too few held-out
rows to judge is not promoted, with the reason. Errors that the same inputs would raise again are not
retried (`failing_for_good`); a lane that is down or busy is (LANE_RETRY).
"""

import base64
import hashlib
import json
import time
from contextlib import nullcontext
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    Failure,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)

from lanes_pipeline.daily.partitions import previous_day
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.dataset.held_out_tasks import HELD_OUT_TASKS, load_held_out
from lanes_pipeline.dataset.window import dataset_root, fingerprint, load_split, window_dirs
from lanes_pipeline.gpu_lane.adapters import (
    IncompatibleAdapterError,
    Version,
    check_adapter_dir,
    check_lora_config,
    next_version_name,
    supported_target_modules,
)
from lanes_pipeline.gpu_lane.anchor_set import anchor_subset, load_anchor_set
from lanes_pipeline.gpu_lane.client import asleep
from lanes_pipeline.gpu_lane.day_adapter import DayAdapter, day_outcome, failing_for_good, record_outcome
from lanes_pipeline.gpu_lane.evaluation_record import (
    ANSWERS_FILE,
    EVALUATION_FILE,
    paired_table,
    write_answers,
)
from lanes_pipeline.gpu_lane.judge_tasks import DayTasks
from lanes_pipeline.gpu_lane.learning_report import LEARNING_FILE, learning_line, plot_metadata
from lanes_pipeline.gpu_lane.measurement import (
    Measured,
    humaneval_problems,
    measure,
    measurement_inputs,
    starting_adapter,
)
from lanes_pipeline.gpu_lane.promotion import Decision, LearningPoint, learning_point, paired_decision
from lanes_pipeline.gpu_lane.repo_tasks import day_tasks as repo_day_tasks
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource, service_for
from lanes_pipeline.gpu_lane.training.runner import run_training
from lanes_pipeline.gpu_lane.training.spec import LOSS_CURVE, TrainSpec, TrainSummary
from lanes_pipeline.settings import Settings, TrainingConfig, data_dir
from lanes_pipeline.steps import asset_step
from lanes_pipeline.store import ArtifactStore

GROUP, POOL = "gpu_lane", "gpu_lane"
LORA_DATASET, HELD_OUT_TASKS_KEY = AssetKey("lora_dataset"), AssetKey(HELD_OUT_TASKS)
ADAPTER_EVALUATION, SERVED_ADAPTER = AssetKey("adapter_evaluation"), AssetKey("served_adapter")
# The schedule serves a day's adapter (or records "no adapter today") once a day: a day late warns, two fail.
SERVED_FRESHNESS = FreshnessPolicy.time_window(
    fail_window=timedelta(hours=48), warn_window=timedelta(hours=26)
)


def _day(context: AssetExecutionContext) -> date:
    return date.fromisoformat(context.partition_key)


def _window(context: AssetExecutionContext, store: ArtifactStore) -> list[Path]:
    """The saved lora_dataset days of the replay window: the days its dependency's partition mapping gives
    (loop/lineage.py declares it), read through Dagster, not counted again here."""
    return window_dirs(
        store.root, context.asset_partition_keys_for_input(LORA_DATASET.to_python_identifier())
    )


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


def _too_few_rows(rows: int, dirs: list[Path], config: TrainingConfig) -> str:
    window = ", ".join(d.name for d in dirs)
    if rows == 0:
        return f"no training rows in the window ({window})"
    return (
        f"{rows} training row(s) in the window ({window}), fewer than min_train_rows {config.min_train_rows}"
    )


@asset(
    group_name=GROUP,
    pool=POOL,
    retry_policy=LANE_RETRY,
    # The window of days it reads (TimeWindowPartitionMapping of replay_window_days) is declared when the
    # definitions load: see `with_training_window` in loop/lineage.py.
    deps=[LORA_DATASET],
    description="PEFT LoRA trained in a subprocess (Dagster Pipes) on the window of lora_dataset days; a new "
    "version folder, or no adapter today (too few training rows) with the reason.",
)
@asset_step
def lora_adapter(
    context: AssetExecutionContext,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
    artifact_store: ArtifactStoreResource,
) -> MaterializeResult:
    day = _day(context)
    with failing_for_good(f"lora_adapter for {day}"):
        config, store = lora_training.config(), artifact_store.store()
        dirs = _window(context, store)
        if not dirs:
            raise Failure(
                f"no lora_dataset partition in the {config.replay_window_days} days up to {day} under "
                f"{dataset_root(store.root)}: materialize lora_dataset first",
                allow_retries=False,
            )
        rows = len(load_split(dirs, "train"))
        if rows < config.min_train_rows:
            why = _too_few_rows(rows, dirs, config)
            context.log.warning(f"no adapter for {day}: {why}")
            record_outcome(store, day, DayAdapter(reason=why))
            return MaterializeResult(
                metadata={"no_adapter": why, "train_rows": rows, "window": [d.name for d in dirs]}
            )
        metadata = _train_day(context, day, config, dirs, gpu_lane, lora_training, adapter_registry)
        record_outcome(store, day, DayAdapter(version=metadata["version"], reason="trained"))
        window = [d.name for d in dirs]  # the days the replay window's mapping gave that were saved
        return MaterializeResult(metadata={**metadata, "train_rows": rows, "window": window})


def _train_day(
    context: AssetExecutionContext,
    day: date,
    config: TrainingConfig,
    dirs: list[Path],
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
) -> dict[str, Any]:
    base_dir = lora_training.base_model_path()
    supported = supported_target_modules(base_dir)
    planned = {
        "r": config.lora.r,
        "lora_alpha": config.lora.alpha,
        "target_modules": config.lora.target_modules,
    }
    issues = check_lora_config(planned, gpu_lane.config.max_lora_rank, supported)
    if issues:  # before hours of training, not after
        raise IncompatibleAdapterError(f"planned by configs/training.yaml for {day}", issues)
    registry = adapter_registry.registry()
    start, started_from = starting_adapter(registry, gpu_lane.alias_name, day, config)
    # How the trainer is launched is not what it trains (one or N processes take the same steps): an adapter
    # trained before launcher existed, or under another launcher, is still these inputs' adapter.
    trained_by = config.model_dump(mode="json", exclude={"launcher", "processes"})
    given = {"data": fingerprint(dirs), "training": trained_by, "base": str(base_dir)}
    if start is not None:  # the weights it starts from are an input too
        given["start"] = {"version": start.name, "fingerprint": start.fingerprint}
    inputs = json.dumps(given, sort_keys=True)
    inputs_hash = hashlib.sha256(inputs.encode()).hexdigest()
    existing = registry.find(day, inputs_hash)
    if existing is not None and Path(existing.path).is_dir():
        context.log.info(f"{existing.name} was trained on exactly these inputs: reusing it")
        summary = TrainSummary.model_validate(existing.training)
        return {**_training_metadata(existing, summary, reused=True), "started_from": started_from}

    folder = adapter_registry.folder()
    taken = [v.name for v in registry.versions()] + [p.name for p in folder.glob("*") if p.is_dir()]
    name = next_version_name(gpu_lane.config.adapter_prefix, day, taken)
    spec = TrainSpec(
        training=config,
        base_model_dir=str(base_dir),
        dataset_dirs=[str(d) for d in dirs],
        output_dir=str(folder / name),
        init_adapter=start.path if start is not None else None,
    )
    waited = gpu_lane.wait_for_quiet_cpu_lane(
        on_busy=lambda n: context.log.info(f"waiting: the CPU lane has {n:g} request(s) in progress")
    )
    if waited is not None and not waited.quiet:
        raise Failure(
            f"the CPU lane stayed busy for {waited.waited_s:.0f} s: training would fight it for memory "
            "bandwidth (bandwidth.training_wait_max_s in configs/lanes.yaml); the step is retried later"
        )
    days = ", ".join(d.name for d in dirs)
    context.log.info(f"training {name} on {len(dirs)} day(s) of data: {days}; starting from {started_from}")
    freeing_gpu = gpu_lane.config.sleep_mode and _trains_on_cuda(config.device)
    log_path = data_dir() / "logs" / f"training-{name}.log"
    with _gpu_asleep(gpu_lane) if freeing_gpu else nullcontext():
        summary = run_training(spec, log_path, context)  # a TrainingError: see failing_for_good
    check_adapter_dir(folder / name, gpu_lane.config.max_lora_rank, supported)
    version = registry.add(name, day, folder / name, inputs_hash, summary.model_dump(mode="json"))
    context.log.info(
        f"{name}: {summary.steps} steps, final loss {summary.final_loss:.4f}, {summary.tokens_per_s} tok/s"
    )
    waited_s = waited.waited_s if waited is not None else 0.0
    metadata = _training_metadata(version, summary, reused=False)
    return {**metadata, "started_from": started_from, "waited_for_cpu_lane_s": waited_s}


def _trains_on_cuda(device: str) -> bool:
    if device != "auto":
        return device == "cuda"
    import torch  # only to ask; the model is loaded by the trainer process

    return torch.cuda.is_available()


def _gpu_asleep(gpu_lane: GpuLaneResource) -> Any:
    return asleep(gpu_lane.vllm(), level=1)


def _decide(measured: Measured, config: TrainingConfig) -> Decision:
    """The paired promotion rule on the measured scores (promotion.py)."""
    evaluation = config.evaluation
    return paired_decision(
        measured.scores(), evaluation.primary_figure, evaluation.alpha, evaluation.margins.model_dump()
    )


def day_tasks(store: ArtifactStore, day: date, config: TrainingConfig, settings: Settings) -> DayTasks:
    """The day's task sets: the held-out repository tasks and completion points (held_out_tasks'
    held_out.json), the anchor set (never from a repository the user configures) and HumanEval; the
    answers are asked in the dataset's chat format and run in the CPU lane's sandbox, one run each."""
    evaluation = config.evaluation
    held = load_held_out(store, day.isoformat())
    limits = settings.pipeline.cpu_assets.sandbox.model_copy(
        update={"timeout_s": evaluation.timeout_s, "runs": 1}
    )
    anchors = load_anchor_set(data_dir(), limits, exclude=[r.name for r in settings.repos.repos])
    points = sorted(held.completion_points, key=lambda p: p.id)
    return DayTasks(
        repo=repo_day_tasks(held, evaluation.max_repo_tasks),
        anchor=anchor_subset(anchors.functions, evaluation.anchor_tasks),
        problems=humaneval_problems(config),
        points=points[: evaluation.max_completion_points],
        sources=held.sources,
        system_prompt=settings.pipeline.dataset.system_prompt,
        limits=limits,
        not_tasks=anchors.not_tasks,
    )


def _record_learning(store: ArtifactStore, point: LearningPoint) -> dict[str, Any]:
    store.write_json(
        "adapter_evaluation", point.day.isoformat(), LEARNING_FILE, point.model_dump(mode="json")
    )
    return {"learning": learning_line(point), **plot_metadata(point)}


@asset(
    group_name=GROUP,
    pool=POOL,
    retry_policy=LANE_RETRY,
    # held_out_tasks(D): the repository tasks and completion points it judges on; lora_dataset: the held-out
    # eval rows of the window (its mapping declared when the definitions load, as for lora_adapter).
    # adapter_evaluation(D-1): the decision of the day before, whose adapter (if promoted) is the one to
    # beat (current_version).
    deps=[
        lora_adapter,
        HELD_OUT_TASKS_KEY,
        LORA_DATASET,
        AssetDep(ADAPTER_EVALUATION, partition_mapping=previous_day()),
    ],
    description="Base, current adapter and candidate answer the same tasks (held-out completion points, "
    "held-out repository tasks, the anchor set, HumanEval); every answer kept; the candidate is promoted "
    "only when a paired test shows it better on the primary figure and no guard is worse beyond its margin.",
)
@asset_step
def adapter_evaluation(
    context: AssetExecutionContext,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
) -> MaterializeResult:
    day = _day(context)
    with failing_for_good(f"adapter_evaluation for {day}"):
        config, registry, store = lora_training.config(), adapter_registry.registry(), artifact_store.store()
        outcome = day_outcome(store, registry, day)
        if outcome.version is None:
            context.log.info(f"no adapter for {day} ({outcome.reason}): nothing to judge")
            target = registry.alias_target(gpu_lane.alias_name)
            point = learning_point(day, None, None, {}, target.name if target else None, outcome.reason)
            learning = _record_learning(store, point)
            return MaterializeResult(
                metadata={"candidate": "none", "promote": False, "no_adapter": outcome.reason, **learning}
            )
        candidate = registry.get(outcome.version)
        started = time.monotonic()
        tasks = day_tasks(store, day, config, pipeline_settings.load())
        inputs = measurement_inputs(config, tasks)
        dirs = _window(context, store)
        measured = measure(context, candidate, gpu_lane, lora_training, adapter_registry, dirs, tasks)
        seconds = round(time.monotonic() - started, 1)
        requests = sum(n for asked in measured.asked.values() for n in asked.values())
        decision = _decide(measured, config)
        figures = measured.figures()
        evaluation = {
            "candidate": candidate.name,
            "current": measured.current,
            "models": measured.models,
            "figures": {label: f.model_dump(mode="json") for label, f in figures.items()},
            "losses": {label: loss.model_dump() for label, loss in measured.losses.items()},
            "tasks": tasks.sizes(),
            "not_tasks": tasks.not_tasks,
            "eval_samples": config.eval_max_samples,
            "eval_samples_scored": measured.eval_samples,
            "unjudged": measured.unjudged,
            "measured_with": inputs,
            "decision": decision.model_dump(mode="json"),
        }
        registry.record_evaluation(candidate.name, evaluation)
        if not decision.promote and candidate.status == "candidate":
            registry.set_status(candidate.name, "rejected")
        write_answers(store, day, measured)
        store.write_json("adapter_evaluation", context.partition_key, EVALUATION_FILE, evaluation)
        point = learning_point(
            day, candidate.name, decision, figures, measured.current, evaluation_s=seconds, requests=requests
        )
        learning = _record_learning(store, point)
    verdict = "promote" if decision.promote else "reject"
    context.log.info(f"{candidate.name}: {verdict}: " + "; ".join(decision.reasons))
    metadata: dict[str, Any] = {
        "candidate": candidate.name,
        "current": measured.current or "none",
        "promote": decision.promote,
        "primary_figure": decision.primary or "none",
        "primary_p_value": decision.primary_p_value() if decision.primary_p_value() is not None else 1.0,
        "paired_outcome": MetadataValue.md(paired_table(decision)),
        "tasks": MetadataValue.json(tasks.sizes()),
        "not_tasks": len(tasks.not_tasks),
        "requests": requests,
        "evaluation_s": seconds,
        "eval_loss_measured": measured.unjudged is None,
        "eval_samples_scored": measured.eval_samples,
        "answers": MetadataValue.path(
            str(store.folder("adapter_evaluation", context.partition_key) / ANSWERS_FILE)
        ),
        "reasons": MetadataValue.md("\n".join(f"- {r}" for r in decision.reasons)),
        **learning,
    }
    for label, f in figures.items():
        for name, value in f.model_dump(exclude={"eval_loss_by_kind", "intervals", "tasks"}).items():
            if value is not None:
                metadata[f"{label}_{name}"] = value
    return MaterializeResult(metadata=metadata)


@asset(
    group_name=GROUP,
    pool=POOL,
    retry_policy=LANE_RETRY,
    # The day's adapter (its outcome) and the decision; served_adapter(D-1): the alias moves in day order.
    deps=[
        lora_adapter,
        adapter_evaluation,
        AssetDep(SERVED_ADAPTER, partition_mapping=previous_day()),
    ],
    freshness_policy=SERVED_FRESHNESS,
    description="The day's adapter loaded into vLLM under its version name; the stable alias moved to it if "
    "it passed evaluation. No adapter today: nothing is asked of vLLM.",
)
@asset_step
def served_adapter(
    context: AssetExecutionContext,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
    artifact_store: ArtifactStoreResource,
) -> MaterializeResult:
    day = _day(context)
    with failing_for_good(f"served_adapter for {day}"):
        registry = adapter_registry.registry()
        outcome = day_outcome(artifact_store.store(), registry, day)
        if outcome.version is None:
            target = registry.alias_target(gpu_lane.alias_name)
            context.log.info(f"no adapter for {day} ({outcome.reason}): {gpu_lane.alias_name} stays")
            return MaterializeResult(
                metadata={
                    "candidate": "none",
                    "promoted": False,
                    "alias": gpu_lane.alias_name,
                    "alias_target": target.name if target else "none",
                    "alias_moved": False,
                    "no_adapter": outcome.reason,
                }
            )
        candidate = registry.get(outcome.version)
        decision = candidate.evaluation.get("decision")
        if decision is None:
            raise Failure(
                f"{candidate.name} has not been evaluated: materialize adapter_evaluation for {day} first",
                allow_retries=False,
            )
        return _serve(
            context, day, candidate, bool(decision["promote"]), gpu_lane, lora_training, adapter_registry
        )


def _serve(
    context: AssetExecutionContext,
    day: date,
    candidate: Version,
    promote: bool,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
) -> MaterializeResult:
    # The day's promotion happens once: a re-run (or a backfill over the day after later days moved the
    # alias, or after a rollback) leaves the alias where it is instead of moving it back to this version.
    report = None
    with gpu_lane.vllm() as client:
        service = service_for(gpu_lane, adapter_registry, lora_training, client)
        history = service.registry.alias_history(gpu_lane.alias_name)
        earlier = [m for m in history if m.version == candidate.name]
        if promote and not earlier:
            report = service.promote(candidate, reason=f"daily {day}")
            context.log.info(
                f"{report.alias} -> {report.version} in {report.seconds:.2f} s "
                f"(smoke answer {report.smoke_answer!r})"
            )
        else:
            restored = service.restore()  # keep what was served, even across a restart
            why = f"was promoted at {earlier[0].moved_at} already" if promote else "was rejected"
            context.log.info(
                f"{candidate.name} {why}; {gpu_lane.alias_name} stays"
                + (f" (restored {', '.join(restored)})" if restored else "")
            )
        target = service.registry.alias_target(gpu_lane.alias_name)
        loaded = sorted(service.loaded())
    metadata: dict[str, Any] = {
        "candidate": candidate.name,
        "promoted": promote,
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

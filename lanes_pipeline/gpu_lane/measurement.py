"""What adapter_evaluation measures for one candidate: eval losses (a trainer subprocess) and task scores
(requests through vLLM), for the base model, the current adapter and the candidate. Recorded in the
registry, so a re-run of the day judges the recorded figures instead of asking the lanes again."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext

from lanes_pipeline.gpu_lane.adapters import AdapterRegistry, Version
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.evaluation import Figures, TaskScore, task_score
from lanes_pipeline.gpu_lane.resources import (
    AdapterRegistryResource,
    GpuLaneResource,
    LoraTrainingResource,
    service_for,
)
from lanes_pipeline.gpu_lane.training.runner import run_evaluation
from lanes_pipeline.gpu_lane.training.spec import EvalSpec
from lanes_pipeline.gpu_lane.training_window import load_split
from lanes_pipeline.settings import TrainingConfig, data_dir


@dataclass
class Measured:
    """The figures of one candidate; the promotion decision is a pure function of them. `unjudged`: why
    the eval loss could not be measured (too few held-out rows): then the candidate is not promoted."""

    current: str | None  # the promoted version the candidate was measured against
    figures: dict[str, Figures]
    scores: dict[str, TaskScore]
    eval_samples: int = 0
    unjudged: str | None = None


def measurement_inputs(config: TrainingConfig) -> dict[str, Any]:
    """The settings the figures depend on besides the candidate itself (its training inputs fix its data
    window, thus the held-out split): the same inputs give the same figures, so they are not measured
    again."""
    return {
        "eval_max_samples": config.eval_max_samples,
        "max_seq_len": config.max_seq_len,
        "min_eval_rows": config.min_eval_rows,
    }


def recorded(candidate: Version, inputs: dict[str, Any]) -> Measured | None:
    evaluation = candidate.evaluation
    if evaluation.get("measured_with") != inputs:
        return None
    return Measured(
        current=evaluation["current"],
        figures={label: Figures.model_validate(f) for label, f in evaluation["figures"].items()},
        scores={label: TaskScore.model_validate(s) for label, s in evaluation["task_scores"].items()},
        eval_samples=evaluation.get("eval_samples_scored", 0),
        unjudged=evaluation.get("unjudged"),
    )


def current_version(registry: AdapterRegistry, alias: str, candidate: Version) -> Version | None:
    """The latest version the alias pointed at, other than the candidate."""
    return next(
        (
            registry.get(m.version)
            for m in reversed(registry.alias_history(alias))
            if m.version != candidate.name
        ),
        None,
    )


def _too_few(scored: int | None, rows: int, config: TrainingConfig) -> str:
    """Why the eval loss is not judged; `scored`: of the `rows`, those with assistant tokens (None: not
    tokenized, there were too few rows already)."""
    found = f"{rows} held-out row(s)" if scored is None else f"{scored} of {rows} held-out rows scorable"
    return (
        f"{found} in the window, fewer than min_eval_rows {config.min_eval_rows}: the eval loss cannot be "
        "judged"
    )


def _task_scores(client: VllmClient, models: dict[str, str]) -> dict[str, TaskScore]:
    """label -> score of the served model name; the prompts of the three models run side by side."""
    with ThreadPoolExecutor(max_workers=len(models)) as pool:
        futures = {label: pool.submit(task_score, client, served) for label, served in models.items()}
        return {label: future.result() for label, future in futures.items()}


def measure(
    context: AssetExecutionContext,
    candidate: Version,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
    dirs: list[Path],
) -> Measured:
    """Eval losses first (no vLLM); with too few held-out rows to judge, stop there: vLLM is not asked."""
    config, registry = lora_training.config(), adapter_registry.registry()
    current = current_version(registry, gpu_lane.alias_name, candidate)
    current_name = current.name if current else None
    rows = len(load_split(dirs, "eval"))
    if rows < config.min_eval_rows:  # known before loading a model
        return Measured(current_name, {}, {}, unjudged=_too_few(None, rows, config))
    adapters = {candidate.name: candidate.path} | ({current.name: current.path} if current else {})
    spec = EvalSpec(
        training=config,
        base_model_dir=str(lora_training.base_model_path()),
        dataset_dirs=[str(d) for d in dirs],
        adapters=adapters,
    )
    report = run_evaluation(spec, data_dir() / "logs" / f"eval-{candidate.name}.log", context)
    if report.samples < config.min_eval_rows:
        unjudged = _too_few(report.samples, report.rows, config)
        return Measured(current_name, {}, {}, eval_samples=report.samples, unjudged=unjudged)
    losses = {r.model: r.loss for r in report.results}
    with gpu_lane.vllm() as client:
        service = service_for(gpu_lane, adapter_registry, lora_training, client)
        served = {"base": gpu_lane.config.served_model_name, "candidate": candidate.name}
        service.ensure_loaded(candidate)
        if current is not None:
            service.ensure_loaded(current)
            served["current"] = current.name
        scores = _task_scores(client, served)
    figures = {
        "base": Figures(eval_loss=losses["base"], task_score=scores["base"].score),
        "candidate": Figures(eval_loss=losses[candidate.name], task_score=scores["candidate"].score),
    }
    if current is not None:
        figures["current"] = Figures(eval_loss=losses[current.name], task_score=scores["current"].score)
    return Measured(current_name, figures, scores, eval_samples=report.samples)

"""What adapter_evaluation measures for one candidate, for the base model, the current adapter and the
candidate: the eval loss on the held-out symbols' rows (a trainer subprocess), `repo_pass_rate` on the
held-out repository tasks and HumanEval pass@1 (answers through vLLM, run in the sandbox). Recorded in the
registry, so a re-run of the day judges the recorded figures instead of asking the lanes again."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext

from lanes_pipeline.daily.resources import LoraTrainingResource
from lanes_pipeline.dataset.holdout_rules import HeldOutFunction
from lanes_pipeline.dataset.window import load_split
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry, Version
from lanes_pipeline.gpu_lane.code_tasks import PassRate, pass_rate
from lanes_pipeline.gpu_lane.humaneval import HumanEvalProblem, daily_subset, humaneval_pass1, load_problems
from lanes_pipeline.gpu_lane.promotion import Figures
from lanes_pipeline.gpu_lane.repo_tasks import body_task, judge_body, task_name
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource, service_for
from lanes_pipeline.gpu_lane.training.runner import run_evaluation
from lanes_pipeline.gpu_lane.training.spec import EvalSpec
from lanes_pipeline.settings import SandboxLimits, TrainingConfig, data_dir
from lanes_pipeline.store import canonical_json, sha256_bytes


@dataclass
class Measured:
    """The figures of one candidate; the promotion decision is a pure function of them. `unjudged`: why
    the eval loss could not be measured (too few held-out rows): the executed figures then decide."""

    current: str | None  # the promoted version the candidate was measured against
    figures: dict[str, Figures]
    pass_rates: dict[str, dict[str, PassRate]] = field(default_factory=dict)  # label -> repo|humaneval
    eval_samples: int = 0
    unjudged: str | None = None


@dataclass
class ExecutedTasks:
    """What the executed figures run: the day's held-out functions and the HumanEval problems."""

    functions: list[HeldOutFunction]
    problems: list[HumanEvalProblem]
    system_prompt: str
    limits: SandboxLimits

    def fingerprint(self) -> str:
        names = {
            "repo": [task_name(f) + f.commit for f in self.functions],
            "humaneval": [p.task_id for p in self.problems],
        }
        return sha256_bytes(canonical_json(names))[:16]


def humaneval_problems(config: TrainingConfig) -> list[HumanEvalProblem]:
    return daily_subset(load_problems(), config.evaluation.humaneval_problems)


def measurement_inputs(config: TrainingConfig, tasks: ExecutedTasks) -> dict[str, Any]:
    """The settings and tasks the figures depend on besides the candidate itself (its training inputs fix
    its data window, thus the held-out rows): the same inputs give the same figures, so they are not
    measured again."""
    return {
        "eval_max_samples": config.eval_max_samples,
        "max_seq_len": config.max_seq_len,
        "min_eval_rows": config.min_eval_rows,
        "evaluation": config.evaluation.model_dump(mode="json"),
        "tasks": tasks.fingerprint(),
    }


def recorded(candidate: Version, inputs: dict[str, Any]) -> Measured | None:
    evaluation = candidate.evaluation
    if evaluation.get("measured_with") != inputs:
        return None
    return Measured(
        current=evaluation["current"],
        figures={label: Figures.model_validate(f) for label, f in evaluation["figures"].items()},
        pass_rates={
            label: {kind: PassRate.model_validate(rate) for kind, rate in rates.items()}
            for label, rates in evaluation.get("pass_rates", {}).items()
        },
        eval_samples=evaluation.get("eval_samples_scored", 0),
        unjudged=evaluation.get("unjudged"),
    )


def current_version(registry: AdapterRegistry, alias: str, candidate: Version) -> Version | None:
    """The version the candidate must beat: the latest the alias pointed at (other than the candidate), or,
    when it is of a later day, an earlier day's version judged for promotion whose serving has not run yet.
    An asset backfill orders each asset's days (adapter_evaluation and served_adapter each depend on their
    own previous day) but may judge day D before day D-1's served_adapter step has moved the alias."""
    history = registry.alias_history(alias)
    served = next((registry.get(m.version) for m in reversed(history) if m.version != candidate.name), None)
    moved = {m.version for m in history}
    pending = [
        v
        for v in registry.versions()
        if v.day < candidate.day
        and v.name not in moved
        and (v.evaluation.get("decision") or {}).get("promote")
    ]
    latest = max(pending, key=lambda v: (v.day, v.created_at), default=None)
    if latest is not None and (served is None or latest.day > served.day):
        return latest
    return served


def _too_few(scored: int | None, rows: int, config: TrainingConfig) -> str:
    """Why the eval loss is not judged; `scored`: of the `rows`, those with assistant tokens (None: not
    tokenized, there were too few rows already)."""
    found = f"{rows} held-out row(s)" if scored is None else f"{scored} of {rows} held-out rows scorable"
    return f"{found} in the window, fewer than min_eval_rows {config.min_eval_rows}"


def _eval_losses(
    context: AssetExecutionContext,
    candidate: Version,
    current: Version | None,
    config: TrainingConfig,
    base_dir: Path,
    dirs: list[Path],
) -> tuple[dict[str, float], int, str | None]:
    """(model -> eval loss on the held-out rows, rows scored, why not judged or None)."""
    rows = len(load_split(dirs, "eval"))
    if rows < config.min_eval_rows:  # known before loading a model
        return {}, 0, _too_few(None, rows, config)
    adapters = {candidate.name: candidate.path} | ({current.name: current.path} if current else {})
    spec = EvalSpec(
        training=config, base_model_dir=str(base_dir), dataset_dirs=[str(d) for d in dirs], adapters=adapters
    )
    report = run_evaluation(spec, data_dir() / "logs" / f"eval-{candidate.name}.log", context)
    if report.samples < config.min_eval_rows:
        return {}, report.samples, _too_few(report.samples, report.rows, config)
    return {r.model: r.loss for r in report.results}, report.samples, None


def executed_pass_rates(
    client: Any, served: str, tasks: ExecutedTasks, config: TrainingConfig
) -> dict[str, PassRate]:
    """repo_pass_rate and HumanEval pass@1 of one served model name."""
    evaluation = config.evaluation
    by_name = {task_name(f): f for f in tasks.functions}
    repo = pass_rate(
        client,
        served,
        [body_task(f, tasks.system_prompt) for f in tasks.functions],
        lambda task, answer: judge_body(by_name[task.name], answer, tasks.limits),
        evaluation.max_tokens,
        evaluation.workers,
    )
    humaneval = humaneval_pass1(client, served, tasks.problems, evaluation, tasks.limits, tasks.system_prompt)
    return {"repo": repo, "humaneval": humaneval}


def measure(
    context: AssetExecutionContext,
    candidate: Version,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
    dirs: list[Path],
    tasks: ExecutedTasks,
) -> Measured:
    """Eval losses first (no vLLM), then the executed figures of base, current and candidate."""
    config, registry = lora_training.config(), adapter_registry.registry()
    current = current_version(registry, gpu_lane.alias_name, candidate)
    current_name = current.name if current else None
    losses, scored, unjudged = _eval_losses(
        context, candidate, current, config, lora_training.base_model_path(), dirs
    )
    by_label = {"base": "base", "candidate": candidate.name} | ({"current": current.name} if current else {})
    if not tasks.functions:
        # Without held-out repository tasks the rule cannot promote (repo_pass_rate is unmeasured): vLLM is
        # not asked for figures that could not change the decision.
        context.log.warning("no held-out repository tasks for the day: the candidate cannot be promoted")
        figures = {label: Figures(eval_loss=losses.get(model)) for label, model in by_label.items()}
        return Measured(current_name, figures, {}, eval_samples=scored, unjudged=unjudged)
    with gpu_lane.vllm() as client:
        service = service_for(gpu_lane, adapter_registry, lora_training, client)
        served = {"base": gpu_lane.config.served_model_name, "candidate": candidate.name}
        service.ensure_loaded(candidate)
        if current is not None:
            service.ensure_loaded(current)
            served["current"] = current.name
        for label, name in served.items():
            context.log.info(
                f"{label} ({name}): {len(tasks.functions)} repository task(s), "
                f"{len(tasks.problems)} HumanEval problem(s)"
            )
        # The models asked side by side: vLLM batches their requests (up to max_loras adapters a step) and
        # one model's sandbox runs overlap another's answers, where one after the other left vLLM idle.
        with ThreadPoolExecutor(len(served), thread_name_prefix="measure") as pool:
            running = {
                label: pool.submit(executed_pass_rates, client, name, tasks, config)
                for label, name in served.items()
            }
            rates = {label: future.result() for label, future in running.items()}
    figures = {
        label: Figures(
            eval_loss=losses.get(model),
            repo_pass_rate=rates[label]["repo"].rate,
            humaneval_pass1=rates[label]["humaneval"].rate if tasks.problems else None,
        )
        for label, model in by_label.items()
    }
    return Measured(current_name, figures, rates, eval_samples=scored, unjudged=unjudged)

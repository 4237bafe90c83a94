"""What adapter_evaluation measures for one candidate, for the base model, the current adapter and the
candidate: the eval loss on the held-out rows (a trainer subprocess, by task kind) and every answer to the
day's task sets (judge_tasks.py: repository tasks, the anchor set, HumanEval, completion points), asked of
the three models side by side through vLLM. Answers are cached per model (answer_cache.py), so a re-run
of the day, or a later day's base and current adapter, ask nothing they answered before; the eval losses
and the version the candidate was measured against are recorded in the registry and reused by a re-run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext

from lanes_pipeline.daily.resources import LoraTrainingResource
from lanes_pipeline.dataset.window import load_split
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry, Version
from lanes_pipeline.gpu_lane.answer_cache import AnswerCache
from lanes_pipeline.gpu_lane.humaneval import HumanEvalProblem, daily_subset, load_problems
from lanes_pipeline.gpu_lane.judge_tasks import DayTasks, answer_all, plans
from lanes_pipeline.gpu_lane.judged import EvalLoss, TaskAnswer
from lanes_pipeline.gpu_lane.promotion import EVAL_ROWS, FIGURES, Figures, Scores, figure_scores, figures_of
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource, service_for
from lanes_pipeline.gpu_lane.training.runner import run_evaluation
from lanes_pipeline.gpu_lane.training.spec import EvalSpec
from lanes_pipeline.settings import TrainingConfig, data_dir
from lanes_pipeline.store import sha256_bytes

ANSWER_CACHE = "evaluation_answers"  # beside the adapters folder: answers live as long as their versions


@dataclass
class Measured:
    """Everything the decision rests on. `unjudged`: why no eval loss was measured (too few rows)."""

    current: str | None  # the promoted version the candidate was measured against
    models: dict[str, str]  # label -> served model name
    answers: dict[str, dict[str, list[TaskAnswer]]]  # label -> task set -> answers
    losses: dict[str, EvalLoss] = field(default_factory=dict)
    asked: dict[str, dict[str, int]] = field(default_factory=dict)  # label -> task set -> requests made
    eval_samples: int = 0
    unjudged: str | None = None

    def scores(self) -> dict[str, Scores]:
        return {
            label: figure_scores(
                self.answers.get(label, {}), self.losses[label].row_losses if label in self.losses else {}
            )
            for label in self.models
        }

    def figures(self) -> dict[str, Figures]:
        out = {}
        for label, scores in self.scores().items():
            loss = self.losses.get(label)
            figures = figures_of(scores, loss.loss if loss else None)
            out[label] = figures.model_copy(update={"eval_loss_by_kind": loss.by_kind if loss else {}})
        return out


def humaneval_problems(config: TrainingConfig) -> list[HumanEvalProblem]:
    return daily_subset(load_problems(), config.evaluation.humaneval_problems)


def measurement_inputs(config: TrainingConfig, tasks: DayTasks) -> dict[str, Any]:
    """The settings and tasks the figures depend on besides the candidate itself (its training inputs fix
    its data window, thus the held-out rows)."""
    return {
        "eval_max_samples": config.eval_max_samples,
        "max_seq_len": config.max_seq_len,
        "min_eval_rows": config.min_eval_rows,
        "evaluation": config.evaluation.model_dump(mode="json"),
        "tasks": tasks.fingerprint(),
    }


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


def starting_adapter(
    registry: AdapterRegistry, alias: str, day: date, config: TrainingConfig
) -> tuple[Version | None, str]:
    """What day `day`'s training starts from, and why: with start_from current, the adapter the alias last
    pointed at among earlier days' versions (after a rollback, the one rolled back to), or a later earlier
    day's version judged for promotion and not served yet (current_version's rule, by day); the base (a
    fresh LoRA) when there is none, when its LoRA shape differs from the configured one, or with start_from
    base."""
    if config.start_from == "base":
        return None, "base (start_from: base)"
    earlier = {v.name: v for v in registry.versions() if v.day < day}
    history = [m for m in registry.alias_history(alias) if m.version in earlier]
    start = earlier[history[-1].version] if history else None
    moved = {m.version for m in registry.alias_history(alias)}
    pending = [
        v
        for v in earlier.values()
        if v.name not in moved and (v.evaluation.get("decision") or {}).get("promote")
    ]
    latest = max(pending, key=lambda v: (v.day, v.created_at), default=None)
    if latest is not None and (start is None or latest.day > start.day):
        start = latest
    if start is None:
        return None, "base (no adapter served before this day)"
    shape = (start.training or {}).get("lora")
    if shape != config.lora.model_dump(mode="json"):
        return None, f"base ({start.name} has LoRA {shape}, training.yaml asks {config.lora.model_dump()})"
    if not Path(start.path).is_dir():
        return None, f"base ({start.name}'s folder {start.path} is gone)"
    return start, start.name


def _too_few(scored: int | None, rows: int, config: TrainingConfig) -> str:
    """Why the eval loss is not measured; `scored`: of the `rows`, those with assistant tokens (None: not
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
) -> tuple[dict[str, EvalLoss], int, str | None]:
    """(model name -> eval loss on the held-out rows, rows scored, why not measured or None)."""
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
    losses = {
        r.model: EvalLoss(
            loss=r.loss,
            by_kind=dict(r.by_kind),
            row_losses=dict(r.row_losses),
        )
        for r in report.results
    }
    return losses, report.samples, None


def base_identity(served_name: str, base_dir: Path) -> str:
    """The base model's key in the answer cache: its served name and its folder (another base, other
    answers)."""
    return f"base-{served_name}-{sha256_bytes(str(base_dir).encode())[:8]}"


def primary_measurable(primary: str, tasks: DayTasks, unjudged: str | None) -> bool:
    """Whether the day has anything to measure the primary figure on."""
    task_set = FIGURES[primary].task_set
    return unjudged is None if task_set == EVAL_ROWS else tasks.sizes().get(task_set, 0) > 0


def version_identity(version: Version) -> str:
    """An adapter's key in the answer cache: its name and when it was registered (a name registered again,
    after its folder was deleted and retrained, is another model)."""
    return f"{version.name}-{sha256_bytes((version.path + version.created_at).encode())[:8]}"


def _recorded(candidate: Version, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The candidate's earlier measurement with these inputs (a re-run of the day): its verdict stands
    against the version that was current then, and its eval losses are not measured again."""
    evaluation = candidate.evaluation
    if evaluation.get("measured_with") != inputs or "losses" not in evaluation:
        return None
    return evaluation


def measure(
    context: AssetExecutionContext,
    candidate: Version,
    gpu_lane: GpuLaneResource,
    lora_training: LoraTrainingResource,
    adapter_registry: AdapterRegistryResource,
    dirs: list[Path],
    tasks: DayTasks,
) -> Measured:
    """Eval losses first (no vLLM), then every task set's answers of base, current and candidate."""
    config, registry = lora_training.config(), adapter_registry.registry()
    base_dir = lora_training.base_model_path()
    recorded = _recorded(candidate, measurement_inputs(config, tasks))
    if recorded is not None:
        current = registry.get(recorded["current"]) if recorded["current"] else None
        losses = {label: EvalLoss.model_validate(loss) for label, loss in recorded["losses"].items()}
        scored, unjudged = recorded.get("eval_samples_scored", 0), recorded.get("unjudged")
        context.log.info(f"{candidate.name} was measured with these inputs already: its eval losses reused")
    else:
        current = current_version(registry, gpu_lane.alias_name, candidate)
        named, scored, unjudged = _eval_losses(context, candidate, current, config, base_dir, dirs)
        # The eval process names the base "base" and each adapter by its version name.
        evaluated = {"base": "base", "candidate": candidate.name} | (
            {"current": current.name} if current else {}
        )
        losses = {label: named[model] for label, model in evaluated.items() if model in named}
    base_name = gpu_lane.config.served_model_name
    models = {"base": base_name, "candidate": candidate.name} | ({"current": current.name} if current else {})
    identity = {"base": base_identity(base_name, base_dir), "candidate": version_identity(candidate)} | (
        {"current": version_identity(current)} if current else {}
    )
    current_name = current.name if current else None
    primary = config.evaluation.primary_figure
    if not primary_measurable(primary, tasks, unjudged):
        # The rule cannot promote without its primary figure: vLLM is not asked for figures that could
        # not change the decision (the decision says why).
        context.log.warning(f"no {primary} to measure for {candidate.name}: it cannot be promoted")
        return Measured(current_name, models, {}, losses, {}, eval_samples=scored, unjudged=unjudged)
    cache = AnswerCache(adapter_registry.folder().parent / ANSWER_CACHE)
    plan_list = plans(tasks, config.evaluation)
    context.log.info(f"task sets: {tasks.sizes()}; models: {models}")
    with gpu_lane.vllm() as client:
        service = service_for(gpu_lane, adapter_registry, lora_training, client)
        service.ensure_loaded(candidate)
        if current is not None:
            service.ensure_loaded(current)
        # The models asked side by side: vLLM batches their requests (up to max_loras adapters a step) and
        # one model's sandbox runs overlap another's answers, where one after the other left vLLM idle.
        with ThreadPoolExecutor(len(models), thread_name_prefix="measure") as pool:
            running = {
                label: pool.submit(answer_all, client, name, identity[label], plan_list, cache)
                for label, name in models.items()
            }
            answered = {label: future.result() for label, future in running.items()}
    for label, result in answered.items():
        context.log.info(f"{label} ({models[label]}): asked {result.asked} (the rest from the answer cache)")
    return Measured(
        current=current_name,
        models=models,
        answers={label: result.answers for label, result in answered.items()},
        losses=losses,
        asked={label: result.asked for label, result in answered.items()},
        eval_samples=scored,
        unjudged=unjudged,
    )

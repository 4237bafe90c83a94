"""Asset checks of the GPU-lane assets, per daily partition.

- `adapter_evaluation_has_every_figure`: the day's candidate was judged with every figure its decision
  rests on (repo_pass_rate, HumanEval pass@1 and, unless the day had too few held-out rows, eval loss; of
  the base, the candidate and the current adapter it was measured against). A promoted candidate without
  them is an error; an unpromoted one a warning. A day without an adapter passes.
- `promoted_adapter_within_limits`: the promotion rule, applied again to the recorded figures with the
  configured limits, agrees that a promoted candidate may be served (a candidate outside any limit never is).
- `served_alias_is_loaded`: the stable alias points at a registered, promoted version, and vLLM serves the
  alias from that version's folder on the base model. A day without an adapter passes without asking vLLM
  (nothing was served that day).
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from datetime import date

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    PartitionsDefinition,
    asset_check,
)

from lanes_pipeline.daily.resources import ArtifactStoreResource, LoraTrainingResource
from lanes_pipeline.errors import LaneError
from lanes_pipeline.gpu_lane.day_adapter import DayAdapter, day_outcome
from lanes_pipeline.gpu_lane.promotion import Figures, promotion_decision
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource
from lanes_pipeline.settings import TrainingConfig

FIGURE_FIELDS = tuple(Figures.model_fields)


def missing_figures(evaluation: dict) -> list[str]:
    """`label.field` of every figure the recorded evaluation lacks (pure: the check's rule). The eval loss
    is not missing on a day that recorded why it could not be judged."""
    figures = evaluation.get("figures", {})
    labels = ["base", "candidate"] + (["current"] if evaluation.get("current") else [])
    wanted = [f for f in FIGURE_FIELDS if not (f == "eval_loss" and evaluation.get("unjudged"))]
    return [
        f"{label}.{name}"
        for label in labels
        for name in wanted
        if not isinstance(figures.get(label, {}).get(name), int | float)
    ]


def rule_disagrees(evaluation: dict, config: TrainingConfig) -> list[str]:
    """Why the promotion rule, applied to the recorded figures, would not promote (empty: it would)."""
    figures = {label: Figures.model_validate(f) for label, f in evaluation.get("figures", {}).items()}
    if "candidate" not in figures or "base" not in figures:
        return ["no figures recorded"]
    decision = promotion_decision(
        figures["candidate"],
        figures["base"],
        figures.get("current"),
        config.eval_loss_margin,
        config.evaluation.humaneval_tolerance,
        unjudged_loss=evaluation.get("unjudged"),
        repo_tolerance=config.evaluation.repo_pass_tolerance,
    )
    return [] if decision.promote else decision.reasons


def _day_evaluation(
    context: AssetCheckExecutionContext,
    adapter_registry: AdapterRegistryResource,
    artifact_store: ArtifactStoreResource,
) -> tuple[DayAdapter, dict]:
    """The day's adapter outcome and its recorded evaluation (empty without an adapter)."""
    registry = adapter_registry.registry()
    outcome = day_outcome(artifact_store.store(), registry, date.fromisoformat(context.partition_key))
    return outcome, registry.get(outcome.version).evaluation if outcome.version is not None else {}


def build_gpu_checks(partitions: PartitionsDefinition) -> list[AssetChecksDefinition]:
    """The checks, on the daily partitions that the definitions build from the configs at load time."""

    @asset_check(
        asset="adapter_evaluation",
        partitions_def=partitions,
        description="The day's candidate was judged with every figure its decision rests on.",
    )
    def adapter_evaluation_has_every_figure(
        context: AssetCheckExecutionContext,
        adapter_registry: AdapterRegistryResource,
        artifact_store: ArtifactStoreResource,
    ) -> AssetCheckResult:
        outcome, evaluation = _day_evaluation(context, adapter_registry, artifact_store)
        if outcome.version is None:
            return AssetCheckResult(passed=True, metadata={"no_adapter": outcome.reason})
        decision = evaluation.get("decision")
        if decision is None:
            return AssetCheckResult(
                passed=False, metadata={"candidate": outcome.version, "why": "not evaluated"}
            )
        missing = missing_figures(evaluation)
        promoted = bool(decision["promote"])
        return AssetCheckResult(
            passed=not missing,
            # Unjudged and not promoted: worth a look, nothing wrong was served.
            severity=AssetCheckSeverity.ERROR if promoted else AssetCheckSeverity.WARN,
            metadata={
                "candidate": outcome.version,
                "promote": promoted,
                "missing": ", ".join(missing) or "none",
                "unjudged": evaluation.get("unjudged") or "no",
            },
        )

    @asset_check(
        asset="served_adapter",
        partitions_def=partitions,
        description="The alias points at a registered, promoted version that vLLM serves from its folder.",
    )
    def served_alias_is_loaded(
        context: AssetCheckExecutionContext,
        gpu_lane: GpuLaneResource,
        adapter_registry: AdapterRegistryResource,
        artifact_store: ArtifactStoreResource,
    ) -> AssetCheckResult:
        registry = adapter_registry.registry()
        outcome = day_outcome(artifact_store.store(), registry, date.fromisoformat(context.partition_key))
        alias = gpu_lane.alias_name
        if outcome.version is None:
            return AssetCheckResult(passed=True, metadata={"no_adapter": outcome.reason})
        target = registry.alias_target(alias)
        if target is None:
            return AssetCheckResult(passed=True, metadata={"alias": alias, "target": "never set"})
        problems = [] if target.status == "promoted" else [f"{target.name} is {target.status}, not promoted"]
        try:
            with gpu_lane.vllm() as client:
                cards = {card.id: card for card in client.adapters()}
        except LaneError as exc:
            problems.append(f"vLLM could not be asked: {exc}")
            cards = {}
        card = cards.get(alias)
        if not problems:
            if card is None:
                problems.append(f"vLLM does not serve {alias}")
            elif card.root != target.path:
                problems.append(f"vLLM serves {alias} from {card.root}, not {target.path}")
        return AssetCheckResult(
            passed=not problems,
            metadata={"alias": alias, "target": target.name, "problems": "; ".join(problems) or "none"},
        )

    @asset_check(
        asset="served_adapter",
        partitions_def=partitions,
        description="A promoted candidate is within every limit of the promotion rule (re-checked).",
    )
    def promoted_adapter_within_limits(
        context: AssetCheckExecutionContext,
        adapter_registry: AdapterRegistryResource,
        artifact_store: ArtifactStoreResource,
        lora_training: LoraTrainingResource,
    ) -> AssetCheckResult:
        outcome, evaluation = _day_evaluation(context, adapter_registry, artifact_store)
        if outcome.version is None:
            return AssetCheckResult(passed=True, metadata={"no_adapter": outcome.reason})
        if not (evaluation.get("decision") or {}).get("promote"):
            return AssetCheckResult(passed=True, metadata={"candidate": outcome.version, "promoted": False})
        outside = rule_disagrees(evaluation, lora_training.config())
        return AssetCheckResult(
            passed=not outside,
            metadata={
                "candidate": outcome.version,
                "promoted": True,
                "outside": "; ".join(outside) or "none",
            },
        )

    return [adapter_evaluation_has_every_figure, served_alias_is_loaded, promoted_adapter_within_limits]

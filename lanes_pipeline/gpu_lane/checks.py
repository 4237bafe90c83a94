"""Asset checks of the GPU-lane assets, per daily partition.

- `adapter_evaluation_has_every_figure`: the day's candidate was judged on the primary figure its decision
  rests on, and so were the base and the current adapter it was measured against. A promoted candidate
  without it is an error; an unpromoted one a warning. A day without an adapter passes.
- `promoted_adapter_within_limits`: the paired promotion rule, applied again to the day's recorded answers
  (answers.json) with the configured limits, agrees that a promoted candidate may be served.
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
from lanes_pipeline.gpu_lane.evaluation_record import EvaluationRecordError, read_answers
from lanes_pipeline.gpu_lane.promotion import paired_decision
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource
from lanes_pipeline.settings import TrainingConfig
from lanes_pipeline.store import ArtifactStore


def missing_figures(evaluation: dict, primary: str) -> list[str]:
    """`label.figure` of each model whose primary figure the recorded evaluation lacks (pure: the check's
    rule). Guards with no tasks that day are not missing: they had nothing to lose."""
    figures = evaluation.get("figures", {})
    labels = ["base", "candidate"] + (["current"] if evaluation.get("current") else [])
    return [
        f"{label}.{primary}"
        for label in labels
        if not isinstance(figures.get(label, {}).get(primary), int | float)
    ]


def rule_disagrees(store: ArtifactStore, day: str, config: TrainingConfig) -> list[str]:
    """Why the promotion rule, applied again to the day's recorded answers with the configured limits,
    would not promote (empty: it would)."""
    try:
        scores = read_answers(store, day).scores()
    except EvaluationRecordError as exc:
        return [str(exc)]
    if "candidate" not in scores or "base" not in scores:
        return ["no answers recorded for the candidate and the base"]
    evaluation = config.evaluation
    decision = paired_decision(
        scores, evaluation.primary_figure, evaluation.alpha, evaluation.margins.model_dump()
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
        lora_training: LoraTrainingResource,
    ) -> AssetCheckResult:
        outcome, evaluation = _day_evaluation(context, adapter_registry, artifact_store)
        if outcome.version is None:
            return AssetCheckResult(passed=True, metadata={"no_adapter": outcome.reason})
        decision = evaluation.get("decision")
        if decision is None:
            return AssetCheckResult(
                passed=False, metadata={"candidate": outcome.version, "why": "not evaluated"}
            )
        missing = missing_figures(evaluation, lora_training.config().evaluation.primary_figure)
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
        outside = rule_disagrees(artifact_store.store(), context.partition_key, lora_training.config())
        return AssetCheckResult(
            passed=not outside,
            metadata={
                "candidate": outcome.version,
                "promoted": True,
                "outside": "; ".join(outside) or "none",
            },
        )

    return [adapter_evaluation_has_every_figure, served_alias_is_loaded, promoted_adapter_within_limits]

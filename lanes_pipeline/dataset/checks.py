"""Asset checks of the day's LoRA dataset, per daily partition.

- `lora_dataset_has_rows`: the day's dataset is not empty (warning: a day without change is quiet, not
  broken, but a run of empty days means the acceptance rules reject everything).
- `lora_dataset_has_no_secrets` (blocking): no row holds a secret or prompt-injection text; the scrub in
  writer.py should make this impossible, so a failure stops training on that day.
- `lora_dataset_holds_out_symbols` (blocking): no training row holds the body of a held-out symbol
  (holdout_rules.py), so the GPU lane's repository tasks and held-out eval loss measure code it never
  trained on.
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    PartitionsDefinition,
    asset_check,
)

from lanes_pipeline.daily.resources import ArtifactStoreResource
from lanes_pipeline.dataset.contract import Record
from lanes_pipeline.dataset.held_out_tasks import HELD_OUT_TASKS, load_held_out, training_leaks
from lanes_pipeline.sandbox.safety import injection_markers, secret_findings


def _rows(artifact_store: ArtifactStoreResource, day: str) -> dict[str, list[Record]]:
    from datasets import load_from_disk

    folder = artifact_store.store().folder("lora_dataset", day)
    dataset = load_from_disk(str(folder))
    return {split: [Record.model_validate(row) for row in dataset[split]] for split in dataset}


def build_dataset_checks(partitions: PartitionsDefinition) -> list[AssetChecksDefinition]:
    """The checks, on the daily partitions that the definitions build from the configs at load time."""

    @asset_check(
        asset="lora_dataset", partitions_def=partitions, description="The day's LoRA dataset has rows."
    )
    def lora_dataset_has_rows(
        context: AssetCheckExecutionContext, artifact_store: ArtifactStoreResource
    ) -> AssetCheckResult:
        rows = _rows(artifact_store, context.partition_key)
        counts = {split: len(items) for split, items in rows.items()}
        return AssetCheckResult(
            passed=sum(counts.values()) > 0,
            severity=AssetCheckSeverity.WARN,
            metadata={f"{split}_rows": n for split, n in counts.items()},
        )

    @asset_check(
        asset="lora_dataset",
        partitions_def=partitions,
        blocking=True,
        additional_deps=[AssetKey(HELD_OUT_TASKS)],
        description="No training row of the day holds the body of a held-out symbol.",
    )
    def lora_dataset_holds_out_symbols(
        context: AssetCheckExecutionContext, artifact_store: ArtifactStoreResource
    ) -> AssetCheckResult:
        store, day = artifact_store.store(), context.partition_key
        held = load_held_out(store, day)
        train = [row.text() for row in _rows(artifact_store, day).get("train", [])]
        leaks = training_leaks(held, train)
        return AssetCheckResult(
            passed=not leaks,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "held_out_symbols": sum(len(b) for b in held.bodies.values()),
                "train_rows": len(train),
                "leaked": "\n".join(leaks[:20]),
            },
        )

    @asset_check(
        asset="lora_dataset",
        partitions_def=partitions,
        blocking=True,
        description="No row of the day's LoRA dataset holds a secret or prompt-injection text.",
    )
    def lora_dataset_has_no_secrets(
        context: AssetCheckExecutionContext, artifact_store: ArtifactStoreResource
    ) -> AssetCheckResult:
        findings = []
        for split, rows in _rows(artifact_store, context.partition_key).items():
            for row in rows:
                text = row.text()
                found = secret_findings(text) + [f"injection: {m}" for m in injection_markers(text)]
                if found:
                    findings.append(f"{split} {row.content_hash[:12]}: {', '.join(found)}")
        return AssetCheckResult(
            passed=not findings,
            severity=AssetCheckSeverity.ERROR,
            metadata={"rows_with_findings": len(findings), "findings": "\n".join(findings[:20])},
        )

    return [lora_dataset_has_rows, lora_dataset_holds_out_symbols, lora_dataset_has_no_secrets]

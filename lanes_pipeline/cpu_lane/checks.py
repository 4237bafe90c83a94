"""Asset checks of the CPU-lane assets, per daily partition (the dataset's are in dataset/checks.py).

- `repo_analysis_parse_rate`: the share of files the model could not answer in the schema stays under
  `cpu_assets.max_unparseable_ratio`.
- `generated_tests_modules_import`: every module of the day's symbols imports in the sandbox (one that does
  not is named, with its cause and the setting that fixes it, and its symbols were not asked).
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    PartitionsDefinition,
    asset_check,
)

from lanes_pipeline.cpu_lane.assets.common import read_results
from lanes_pipeline.cpu_lane.jobs.rows import AnalysisRow
from lanes_pipeline.cpu_lane.jobs.tests_day import COVERAGE_FILE, COVERAGE_FOLDER, SymbolTestCoverage
from lanes_pipeline.daily.artifacts import read_partition
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource


def build_checks(partitions: PartitionsDefinition) -> list[AssetChecksDefinition]:
    """The checks, on the daily partitions that the definitions build from the configs at load time."""

    @asset_check(
        asset="repo_analysis",
        partitions_def=partitions,
        description="The share of analyses the model could not answer in the schema is under the threshold.",
    )
    def repo_analysis_parse_rate(
        context: AssetCheckExecutionContext,
        artifact_store: ArtifactStoreResource,
        pipeline_settings: PipelineSettingsResource,
    ) -> AssetCheckResult:
        threshold = pipeline_settings.load().pipeline.cpu_assets.max_unparseable_ratio
        store = artifact_store.store()
        repos = read_results(store, "repo_analysis", context.partition_key, AnalysisRow)
        statuses = [item.status for repo in repos for item in repo.files]
        unparseable = statuses.count("unparseable")
        ratio = unparseable / len(statuses) if statuses else 0.0
        return AssetCheckResult(
            passed=ratio <= threshold,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "files": len(statuses),
                "unparseable": unparseable,
                "ratio": ratio,
                "threshold": threshold,
            },
        )

    @asset_check(
        asset="generated_tests",
        partitions_def=partitions,
        description="Every module of the day's symbols imports in the sandbox, so its tests could be asked.",
    )
    def generated_tests_modules_import(
        context: AssetCheckExecutionContext, artifact_store: ArtifactStoreResource
    ) -> AssetCheckResult:
        store = artifact_store.store()
        coverage = read_partition(
            store,
            COVERAGE_FOLDER,
            context.partition_key,
            COVERAGE_FILE,
            list[SymbolTestCoverage],
            "generated_tests' coverage rows",
        )
        problems = {f"{c.repo}: {module}": why for c in coverage for module, why in c.import_problems.items()}
        return AssetCheckResult(
            passed=not problems,
            severity=AssetCheckSeverity.ERROR,
            metadata={"modules_not_importable": len(problems), **dict(list(problems.items())[:10])},
        )

    return [repo_analysis_parse_rate, generated_tests_modules_import]

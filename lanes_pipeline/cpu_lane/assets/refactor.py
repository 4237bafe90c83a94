"""`refactor_proposals`: small refactors of the day's changed files, proposed by the CPU lane as unified
diffs only (whole-file rewrites are slow on a collapsed prefix cache and are refused), parsed with
unidiff, checked with `git apply --check` in a sandbox worktree, then accepted only if the repository's
own tests and the day's accepted generated tests all pass with the diff applied."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections import Counter
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, asset

from lanes_pipeline.cpu_lane.assets.common import (
    LaneQuestions,
    load_snapshots,
    md_table,
    ratio,
    read_results,
    remembered_answer,
    repo_location,
    write_partition,
)
from lanes_pipeline.cpu_lane.assets.tests import generated_tests, target_files
from lanes_pipeline.cpu_lane.judging import DiffJudge
from lanes_pipeline.cpu_lane.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.resource import CpuLaneResource
from lanes_pipeline.cpu_lane.rows import GeneratedTestRow, RefactorFigures, RefactorRow, RememberedAnswer
from lanes_pipeline.cpu_lane.tasks import REFACTOR_DIFF, TASKS_VERSION, file_prompt
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.host import with_host_figures


def figures(items: list[RefactorRow], checks: Memo) -> dict[str, Any]:
    """The asset's figures, and a count per rejection verdict (`rejected_<verdict>`)."""
    counts = Counter(item.verdict for item in items)
    accepted = counts.get("accepted", 0)
    return {
        **RefactorFigures(
            proposals=len(items),
            accepted=accepted,
            acceptance_rate=ratio(accepted, len(items)),
            check_memo_hits=checks.hits,
        ).metadata(),
        **{f"rejected_{verdict}": n for verdict, n in sorted(counts.items()) if verdict != "accepted"},
    }


@asset(
    group_name="cpu_lane",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    deps=[generated_tests],
    description="Refactors as unified diffs, accepted only if they apply and every test passes with them.",
)
@with_host_figures
def refactor_proposals(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
    cpu_lane: CpuLaneResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    config = settings.pipeline.cpu_assets
    store = artifact_store.store()
    lane = LaneQuestions("refactor_proposals", cpu_lane, Memo(store, "refactor_diff"), context.log)
    checks = Memo(store, "diff_check")
    judge = DiffJudge(checks, config.sandbox)
    entries = {e.name: e for e in settings.repos.repos}
    tests = read_results(store, "generated_tests", context.partition_key, GeneratedTestRow)
    items: list[RefactorRow] = []
    for snapshot in load_snapshots(store, context.partition_key):
        targets = target_files(snapshot, config.max_files_per_day)
        if snapshot.commit is None or not targets:
            continue
        repo = repo_location(settings, entries[snapshot.repo])
        keys = {
            f.path: memo_key(
                "refactor_diff", TASKS_VERSION, cpu_lane.config.model, f.blob, config.refactor_max_tokens
            )
            for f in targets
        }
        known = lane.answers(
            snapshot,
            repo,
            targets,
            keys,
            REFACTOR_DIFF,
            config.refactor_max_tokens,
            prompt=lambda f, text: file_prompt(f.path, text),
            shape=remembered_answer,
        )
        answers = {f.path: RememberedAnswer.read(known[f.path]) for f in targets}
        items += judge.rows(snapshot.repo, repo, snapshot.commit, tests, answers)
    lane.check_failures()
    content_hash = write_partition(
        store,
        "refactor_proposals",
        context.partition_key,
        {"results.json": [i.model_dump(mode="json") for i in items]},
    )
    return MaterializeResult(
        metadata={
            **figures(items, checks),
            **lane.metadata(),
            "verdicts": md_table(
                ["repo", "file", "verdict", "reason"], [(i.repo, i.path, i.verdict, i.reason) for i in items]
            ),
            "artifact_hash": content_hash,
        }
    )

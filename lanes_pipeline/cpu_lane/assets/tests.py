"""`generated_tests`: pytest modules the CPU lane writes for the day's changed files, each judged in the
sandbox (throwaway worktree at the snapshot commit, time and memory limits, no network, read-only host).
Accepted only if it passes every run against the real code and is not trivial; every rejection keeps its
reason. Model answers and verdicts are remembered, so a re-run asks nothing and runs nothing."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections import Counter
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, asset

from lanes_pipeline.cpu_lane.assets.analysis import repo_analysis
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
from lanes_pipeline.cpu_lane.judging import GeneratedTestJudge
from lanes_pipeline.cpu_lane.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.repos import FileEntry, Snapshot, is_test_path, module_name
from lanes_pipeline.cpu_lane.resource import CpuLaneResource
from lanes_pipeline.cpu_lane.rows import (
    AnalysisRow,
    GeneratedTestRow,
    GeneratedTestsFigures,
    RememberedAnswer,
)
from lanes_pipeline.cpu_lane.tasks import TASKS_VERSION, WRITE_TESTS, file_prompt
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.host import with_host_figures


def target_files(snapshot: Snapshot, limit: int) -> list[FileEntry]:
    """The day's changed source files (not tests themselves), in path order, at most `limit`."""
    changed = set(snapshot.changed)
    files = [
        f for f in snapshot.files if f.path in changed and f.language == "python" and not is_test_path(f.path)
    ]
    return files[:limit]


def test_notes(analysis: AnalysisRow | None, path: str) -> str:
    for item in analysis.files if analysis else []:
        if item.path == path and item.status == "ok" and item.analysis is not None:
            return "; ".join(item.analysis.test_ideas)
    return ""


def figures(items: list[GeneratedTestRow], judge: GeneratedTestJudge, verdicts: Memo) -> dict[str, Any]:
    """The asset's figures, and a count per rejection verdict (`rejected_<verdict>`)."""
    counts = Counter(item.verdict for item in items)
    accepted = counts.get("passed", 0)
    return {
        **GeneratedTestsFigures(
            candidates=len(items),
            accepted=accepted,
            acceptance_rate=ratio(accepted, len(items)),
            sandbox_runs=judge.sandbox_runs,
            verdict_memo_hits=verdicts.hits,
        ).metadata(),
        **{f"rejected_{verdict}": n for verdict, n in sorted(counts.items()) if verdict != "passed"},
    }


@asset(
    group_name="cpu_lane",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    deps=[repo_analysis],
    description="Generated pytest tests for changed files, accepted after passing repeated sandbox runs.",
)
@with_host_figures
def generated_tests(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
    cpu_lane: CpuLaneResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    config = settings.pipeline.cpu_assets
    store = artifact_store.store()
    lane = LaneQuestions("generated_tests", cpu_lane, Memo(store, "write_tests"), context.log)
    verdicts = Memo(store, "test_verdict")
    judge = GeneratedTestJudge(verdicts, config.sandbox)
    entries = {e.name: e for e in settings.repos.repos}
    analyses = {r.repo: r for r in read_results(store, "repo_analysis", context.partition_key, AnalysisRow)}
    items: list[GeneratedTestRow] = []
    for snapshot in load_snapshots(store, context.partition_key):
        targets = target_files(snapshot, config.max_files_per_day)
        if snapshot.commit is None or not targets:
            continue
        repo = repo_location(settings, entries[snapshot.repo])
        notes = {f.path: test_notes(analyses.get(snapshot.repo), f.path) for f in targets}
        keys = {
            f.path: memo_key(
                "write_tests",
                TASKS_VERSION,
                cpu_lane.config.model,
                f.blob,
                module_name(f.path),
                notes[f.path],
                config.tests_max_tokens,
            )
            for f in targets
        }
        known = lane.answers(
            snapshot,
            repo,
            targets,
            keys,
            WRITE_TESTS,
            config.tests_max_tokens,
            prompt=lambda f, text, notes=notes: file_prompt(f.path, text, module_name(f.path), notes[f.path]),
            shape=remembered_answer,
        )
        answers = {f.path: RememberedAnswer.read(known[f.path]) for f in targets}
        items += judge.rows(snapshot.repo, repo, snapshot.commit, answers)
    lane.check_failures()
    content_hash = write_partition(
        store,
        "generated_tests",
        context.partition_key,
        {"results.json": [i.model_dump(mode="json") for i in items]},
    )
    return MaterializeResult(
        metadata={
            **figures(items, judge, verdicts),
            **lane.metadata(),
            "verdicts": md_table(
                ["repo", "file", "verdict", "reason"], [(i.repo, i.path, i.verdict, i.reason) for i in items]
            ),
            "artifact_hash": content_hash,
        }
    )

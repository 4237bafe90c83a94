"""`repo_analysis`: a structured analysis (summary, public API, risks, test ideas) of every file of the
snapshot from the CPU lane. Only new or changed blobs are asked: an unchanged blob reuses its earlier
analysis by blob hash, so a day without change costs no request and a re-run is byte-identical."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.assets.common import (
    DETERMINISTIC_FAILURES,
    LaneQuestions,
    load_snapshots,
    ratio,
    repo_location,
    write_partition,
)
from lanes_pipeline.cpu_lane.assets.snapshot import repo_snapshot
from lanes_pipeline.cpu_lane.batch_models import ItemResult
from lanes_pipeline.cpu_lane.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.repos import FileEntry
from lanes_pipeline.cpu_lane.resource import CpuLaneResource
from lanes_pipeline.cpu_lane.rows import AnalysisAnswer, AnalysisFigures, AnalysisRow, FileAnalysisRow
from lanes_pipeline.cpu_lane.tasks import ANALYSIS, TASKS_VERSION, FileAnalysis, analysis_problem, file_prompt
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.host import with_host_figures


def analysis_key(model: str, blob: str, max_tokens: int) -> str:
    return memo_key("analysis", TASKS_VERSION, model, blob, max_tokens)


def analysis_value(item: ItemResult) -> dict[str, Any]:
    """What a file's analysis remembers (an AnalysisAnswer): the validated analysis, or why there is none."""
    if item.status == "ok":
        answer = AnalysisAnswer(status="ok", analysis=FileAnalysis.model_validate(item.parsed))
    elif item.failure is not None and item.failure.kind in DETERMINISTIC_FAILURES:
        answer = AnalysisAnswer(status=item.failure.kind, reason=item.failure.reason[:300])
    else:
        answer = AnalysisAnswer(
            status="failed", reason=(item.failure.reason if item.failure else "no answer")[:300]
        )
    return answer.model_dump()


def file_row(file: FileEntry, answer: AnalysisAnswer, defined: set[str]) -> FileAnalysisRow:
    """A file's row: its answer, and for an analysis whether it is accepted (analysis_problem) and why not."""
    row = FileAnalysisRow(path=file.path, blob=file.blob, **answer.model_dump())
    if answer.analysis is None:
        return row
    problem = analysis_problem(answer.analysis, defined)
    return row.model_copy(update={"accepted": problem is None, "reason": problem or ""})


def render_report(repos: list[AnalysisRow]) -> str:
    """The day's analysis as Markdown: one section per file."""
    lines = []
    for repo in repos:
        lines.append(f"## {repo.repo} @ {(repo.commit or 'no commit')[:12]}")
        for item in repo.files:
            lines.append(f"### {item.path} ({item.status})")
            analysis = item.analysis
            if analysis:
                lines.append(analysis.summary)
                lines += [f"- API: `{name}`" for name in analysis.public_api]
                lines += [f"- Risk: {risk}" for risk in analysis.risks]
                lines += [f"- Test idea: {idea}" for idea in analysis.test_ideas]
            elif item.reason:
                lines.append(f"_{item.reason}_")
    return "\n\n".join(lines) + "\n"


def figures(repos: list[AnalysisRow]) -> AnalysisFigures:
    items = [f for r in repos for f in r.files]
    statuses = [f.status for f in items]
    accepted = sum(bool(f.accepted) for f in items)
    return AnalysisFigures(
        files=len(items),
        analysed_ok=statuses.count("ok"),
        unparseable=statuses.count("unparseable"),
        unparseable_ratio=ratio(statuses.count("unparseable"), len(items)),
        too_long=statuses.count("too_long"),
        failed_transient=statuses.count("failed"),
        accepted=accepted,
        acceptance_rate=ratio(accepted, len(items)),
    )


@asset(
    group_name="cpu_lane",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    deps=[repo_snapshot],
    description="Per-file structured analysis from the CPU lane; unchanged blobs reuse earlier answers.",
)
@with_host_figures
def repo_analysis(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
    cpu_lane: CpuLaneResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    max_tokens = settings.pipeline.cpu_assets.analysis_max_tokens
    store = artifact_store.store()
    lane = LaneQuestions("repo_analysis", cpu_lane, Memo(store, "analysis"), context.log)
    entries = {e.name: e for e in settings.repos.repos}
    repos: list[AnalysisRow] = []
    for snapshot in load_snapshots(store, context.partition_key):
        files: list[FileAnalysisRow] = []
        if snapshot.commit is not None:
            keys = {f.path: analysis_key(cpu_lane.config.model, f.blob, max_tokens) for f in snapshot.files}
            known = lane.answers(
                snapshot,
                repo_location(settings, entries[snapshot.repo]),
                snapshot.files,
                keys,
                ANALYSIS,
                max_tokens,
                prompt=lambda f, text: file_prompt(f.path, text),
                shape=analysis_value,
            )
            defined = {o.path: o.defined_names() for o in snapshot.outlines}
            files = [
                file_row(f, AnalysisAnswer.model_validate(known[f.path]), defined.get(f.path, set()))
                for f in snapshot.files
            ]
        repos.append(AnalysisRow(repo=snapshot.repo, commit=snapshot.commit, files=files))
    lane.check_failures()
    report = render_report(repos)
    content_hash = write_partition(
        store,
        "repo_analysis",
        context.partition_key,
        {"results.json": [r.model_dump(mode="json") for r in repos], "report.md": report},
    )
    return MaterializeResult(
        metadata={
            **figures(repos).metadata(),
            **lane.metadata(),
            "report": MetadataValue.md(report[:60_000]),
            "artifact_hash": content_hash,
        }
    )

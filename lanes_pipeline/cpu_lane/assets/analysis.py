"""`repo_analysis`: a structured analysis (summary, public API, risks, test ideas) of every file of the
snapshot from the CPU lane. Only new or changed blobs are asked: an unchanged blob reuses its earlier
analysis by blob hash, so a day without change costs no request and a re-run is byte-identical."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.assets.common import (
    DETERMINISTIC_FAILURES,
    LaneQuestions,
    Memo,
    load_snapshots,
    memo_key,
    ratio,
    repo_location,
    write_partition,
)
from lanes_pipeline.cpu_lane.assets.snapshot import repo_snapshot
from lanes_pipeline.cpu_lane.batch_models import ItemResult
from lanes_pipeline.cpu_lane.resource import CpuLaneResource
from lanes_pipeline.cpu_lane.tasks import ANALYSIS, TASKS_VERSION, FileAnalysis, analysis_problem, file_prompt
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.host import with_host_figures


def analysis_key(model: str, blob: str, max_tokens: int) -> str:
    return memo_key("analysis", TASKS_VERSION, model, blob, max_tokens)


def analysis_value(item: ItemResult) -> dict[str, Any]:
    """What a file's analysis records: the validated analysis, or why there is none."""
    if item.status == "ok":
        return {"status": "ok", "analysis": FileAnalysis.model_validate(item.parsed).model_dump()}
    if item.failure is not None and item.failure.kind in DETERMINISTIC_FAILURES:
        return {"status": item.failure.kind, "reason": item.failure.reason[:300]}
    return {"status": "failed", "reason": (item.failure.reason if item.failure else "no answer")[:300]}


def render_report(repos: list[dict[str, Any]]) -> str:
    """The day's analysis as Markdown: one section per file."""
    lines = []
    for repo in repos:
        lines.append(f"## {repo['repo']} @ {(repo['commit'] or 'no commit')[:12]}")
        for item in repo["files"]:
            lines.append(f"### {item['path']} ({item['status']})")
            analysis = item.get("analysis")
            if analysis:
                lines.append(analysis["summary"])
                lines += [f"- API: `{name}`" for name in analysis["public_api"]]
                lines += [f"- Risk: {risk}" for risk in analysis["risks"]]
                lines += [f"- Test idea: {idea}" for idea in analysis["test_ideas"]]
            elif item.get("reason"):
                lines.append(f"_{item['reason']}_")
    return "\n\n".join(lines) + "\n"


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
    config = settings.pipeline.cpu_assets
    store = artifact_store.store()
    lane = LaneQuestions("repo_analysis", cpu_lane, Memo(store, "analysis"), context.log)
    entries = {e.name: e for e in settings.repos.repos}
    repos_out: list[dict[str, Any]] = []
    for snapshot in load_snapshots(store, context.partition_key):
        files_out: list[dict[str, Any]] = []
        repos_out.append({"repo": snapshot.repo, "commit": snapshot.commit, "files": files_out})
        if snapshot.commit is None:
            continue
        max_tokens = config.analysis_max_tokens
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
        for file in snapshot.files:
            value = dict(known[file.path] or {})
            if value.get("status") == "ok":
                analysis = FileAnalysis.model_validate(value["analysis"])
                problem = analysis_problem(analysis, defined.get(file.path, set()))
                value["accepted"] = problem is None
                value["reason"] = problem or ""
            files_out.append({"path": file.path, "blob": file.blob, **value})
    lane.check_failures()
    report = render_report(repos_out)
    content_hash = write_partition(
        store, "repo_analysis", context.partition_key, {"results.json": repos_out, "report.md": report}
    )
    items = [f for r in repos_out for f in r["files"]]
    statuses = [f["status"] for f in items]
    return MaterializeResult(
        metadata={
            "files": len(items),
            "analysed_ok": statuses.count("ok"),
            "unparseable": statuses.count("unparseable"),
            "unparseable_ratio": ratio(statuses.count("unparseable"), len(items)),
            "too_long": statuses.count("too_long"),
            "failed_transient": statuses.count("failed"),
            "accepted": sum(bool(f.get("accepted")) for f in items),
            "acceptance_rate": ratio(sum(bool(f.get("accepted")) for f in items), len(items)),
            **lane.metadata(),
            "report": MetadataValue.md(report[:60_000]),
            "artifact_hash": content_hash,
        }
    )

"""`repo_analysis`: a structured analysis (summary, public API, risks, test ideas) of every file of the
snapshot from the CPU lane. Only new or changed blobs are asked: an unchanged blob reuses its earlier
analysis by blob hash, so a day without change costs no request and a re-run is byte-identical."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from typing import Any

from dagster import AssetExecutionContext, Failure, MaterializeResult, MetadataValue, asset

from lanes_pipeline.assets.cpu_common import (
    DETERMINISTIC_FAILURES,
    LaneUsage,
    Memo,
    load_snapshots,
    memo_key,
    ratio,
    repo_location,
    write_partition,
)
from lanes_pipeline.assets.snapshot import repo_snapshot
from lanes_pipeline.host import with_host_figures
from lanes_pipeline.lanes.batch import BatchRequest
from lanes_pipeline.partitions import DAILY
from lanes_pipeline.policies import LANE_RETRY
from lanes_pipeline.prompts import PromptLayout
from lanes_pipeline.repos import read_blobs
from lanes_pipeline.resources.artifact_store import ArtifactStoreResource
from lanes_pipeline.resources.cpu_lane import CpuLaneResource
from lanes_pipeline.resources.pipeline_settings import PipelineSettingsResource
from lanes_pipeline.tasks import ANALYSIS, TASKS_VERSION, FileAnalysis, analysis_problem, file_prompt


def analysis_key(model: str, blob: str, max_tokens: int) -> str:
    return memo_key("analysis", TASKS_VERSION, model, blob, max_tokens)


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
    partitions_def=DAILY,
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
    memo = Memo(store, "analysis")
    usage = LaneUsage()
    entries = {e.name: e for e in settings.repos.repos}
    repos_out: list[dict[str, Any]] = []
    transient = asked = 0
    for snapshot in load_snapshots(store, context.partition_key):
        files_out: list[dict[str, Any]] = []
        repos_out.append({"repo": snapshot.repo, "commit": snapshot.commit, "files": files_out})
        if snapshot.commit is None:
            continue
        repo = repo_location(settings, entries[snapshot.repo])
        keys = {
            f.path: analysis_key(cpu_lane.model, f.blob, config.analysis_max_tokens) for f in snapshot.files
        }
        known = {path: memo.get(key) for path, key in keys.items()}
        missing = [f for f in snapshot.files if known[f.path] is None]
        if missing:
            contents = read_blobs(repo, [f.blob for f in missing])
            layout = PromptLayout(ANALYSIS, shared_context=snapshot.repo_map)
            requests: list[BatchRequest] = [
                layout.build(
                    f"{snapshot.repo}:{f.path}",
                    file_prompt(f.path, contents[f.blob].decode("utf-8")),
                    max_tokens=config.analysis_max_tokens,
                )
                for f in missing
            ]
            result = cpu_lane.run_batch(requests, log=context.log, label=f"repo_analysis {snapshot.repo}")
            usage.add(result)
            asked += len(requests)
            for file, item in zip(missing, result.results, strict=True):
                if item.status == "ok":
                    value = {
                        "status": "ok",
                        "analysis": FileAnalysis.model_validate(item.parsed).model_dump(),
                    }
                elif item.failure is not None and item.failure.kind in DETERMINISTIC_FAILURES:
                    value = {"status": item.failure.kind, "reason": item.failure.reason[:300]}
                else:
                    transient += 1
                    reason = item.failure.reason if item.failure else "no answer"
                    known[file.path] = {"status": "failed", "reason": reason[:300]}
                    continue  # not remembered: the next run asks again
                memo.put(keys[file.path], value)
                known[file.path] = value
        defined = {o.path: o.defined_names() for o in snapshot.outlines}
        for file in snapshot.files:
            value = dict(known[file.path] or {})
            if value.get("status") == "ok":
                analysis = FileAnalysis.model_validate(value["analysis"])
                problem = analysis_problem(analysis, defined.get(file.path, set()))
                value["accepted"] = problem is None
                value["reason"] = problem or ""
            files_out.append({"path": file.path, "blob": file.blob, **value})
    if asked and transient / asked > config.max_failure_ratio:
        raise Failure(
            description=f"{transient} of {asked} analysis requests failed for transient reasons "
            f"(> {config.max_failure_ratio:.0%}); answers so far are cached, a re-run asks only for the rest",
            metadata=usage.metadata(memo.hits),
        )
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
            "asked_this_run": asked,
            **usage.metadata(memo.hits),
            "report": MetadataValue.md(report[:60_000]),
            "artifact_hash": content_hash,
        }
    )

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
    Memo,
    load_snapshots,
    md_table,
    memo_key,
    ratio,
    read_partition,
    remembered_answer,
    repo_location,
    write_partition,
)
from lanes_pipeline.cpu_lane.repos import is_test_path, module_name
from lanes_pipeline.cpu_lane.resource import CpuLaneResource
from lanes_pipeline.cpu_lane.sandbox import detect_isolation
from lanes_pipeline.cpu_lane.tasks import (
    TASKS_VERSION,
    WRITE_TESTS,
    extract_block,
    file_prompt,
    test_module_name,
)
from lanes_pipeline.cpu_lane.verification import judge_generated_test
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.host import with_host_figures
from lanes_pipeline.store import sha256_bytes


def target_files(snapshot: Any, limit: int) -> list[Any]:
    """The day's changed source files (not tests themselves), in path order, at most `limit`."""
    changed = set(snapshot.changed)
    files = [
        f for f in snapshot.files if f.path in changed and f.language == "python" and not is_test_path(f.path)
    ]
    return files[:limit]


def test_notes(analysis_repo: dict[str, Any] | None, path: str) -> str:
    for item in (analysis_repo or {}).get("files", []):
        if item["path"] == path and item.get("status") == "ok":
            return "; ".join(item["analysis"]["test_ideas"])
    return ""


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
    entries = {e.name: e for e in settings.repos.repos}
    analyses = {r["repo"]: r for r in read_partition(store, "repo_analysis", context.partition_key)}
    isolation = None
    items: list[dict[str, Any]] = []
    sandbox_runs = 0
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
        for file in targets:
            answer = known[file.path]
            base = {
                "repo": snapshot.repo,
                "path": file.path,
                "module": module_name(file.path),
                "test_file": test_module_name(file.path),
            }
            if answer is None or answer["answer"] is None:
                reason = answer["reason"] if answer else "the CPU lane did not answer"
                items.append({**base, "code": None, "verdict": "no_answer", "reason": reason})
                continue
            code = extract_block(answer["answer"], ("python", "py")).strip() + "\n"
            verdict_key = memo_key(
                "test_verdict",
                TASKS_VERSION,
                sha256_bytes(code.encode()),
                snapshot.commit,
                config.sandbox.model_dump(),
            )
            verdict = verdicts.get(verdict_key)
            if verdict is None:
                isolation = isolation or detect_isolation()
                judged = judge_generated_test(
                    repo, snapshot.commit, file.path, module_name(file.path), code, config.sandbox, isolation
                )
                sandbox_runs += len(judged.runs)
                verdict = {
                    "verdict": judged.verdict,
                    "reason": judged.reason[:600],
                    "runs": [r.outcome for r in judged.runs],
                }
                verdicts.put(verdict_key, verdict)
            items.append({**base, "code": code, **verdict})
    lane.check_failures()
    content_hash = write_partition(store, "generated_tests", context.partition_key, {"results.json": items})
    counts = Counter(item["verdict"] for item in items)
    accepted = counts.get("passed", 0)
    return MaterializeResult(
        metadata={
            "candidates": len(items),
            "accepted": accepted,
            "acceptance_rate": ratio(accepted, len(items)),
            **{f"rejected_{verdict}": n for verdict, n in sorted(counts.items()) if verdict != "passed"},
            "sandbox_runs": sandbox_runs,
            "verdict_memo_hits": verdicts.hits,
            **lane.metadata(),
            "verdicts": md_table(
                ["repo", "file", "verdict", "reason"],
                [(i["repo"], i["path"], i["verdict"], i["reason"]) for i in items],
            ),
            "artifact_hash": content_hash,
        }
    )

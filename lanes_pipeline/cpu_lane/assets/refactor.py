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
from lanes_pipeline.cpu_lane.assets.tests import generated_tests, target_files
from lanes_pipeline.cpu_lane.resource import CpuLaneResource
from lanes_pipeline.cpu_lane.sandbox import detect_isolation
from lanes_pipeline.cpu_lane.tasks import REFACTOR_DIFF, TASKS_VERSION, file_prompt, parse_diff
from lanes_pipeline.cpu_lane.verification import baseline_passes, check_diff
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.host import with_host_figures
from lanes_pipeline.store import canonical_json, sha256_bytes


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
    limits = config.sandbox.model_dump()
    store = artifact_store.store()
    lane = LaneQuestions("refactor_proposals", cpu_lane, Memo(store, "refactor_diff"), context.log)
    checks = Memo(store, "diff_check")
    entries = {e.name: e for e in settings.repos.repos}
    tests = read_partition(store, "generated_tests", context.partition_key)
    isolation = None
    items: list[dict[str, Any]] = []
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
        accepted_tests = {
            t["test_file"]: t["code"]
            for t in tests
            if t["repo"] == snapshot.repo and t["verdict"] == "passed"
        }
        tests_hash = sha256_bytes(canonical_json(accepted_tests))
        baseline: str | None = None
        for file in targets:
            base = {"repo": snapshot.repo, "path": file.path}
            answer = known[file.path]
            if answer is None or answer["answer"] is None:
                reason = answer["reason"] if answer else "the CPU lane did not answer"
                items.append({**base, "diff": None, "verdict": "no_answer", "reason": reason})
                continue
            parsed = parse_diff(answer["answer"], file.path)
            if isinstance(parsed, tuple):
                items.append({**base, "diff": None, "verdict": parsed[0], "reason": parsed[1]})
                continue
            check_key = memo_key(
                "diff_check",
                TASKS_VERSION,
                sha256_bytes(parsed.text.encode()),
                snapshot.commit,
                tests_hash,
                limits,
            )
            check = checks.get(check_key)
            if check is None:
                isolation = isolation or detect_isolation()
                if baseline is None:
                    baseline = baseline_passes(repo, snapshot.commit, config.sandbox, isolation)
                if baseline:
                    check = {
                        "verdict": "baseline_failing",
                        "reason": f"tests fail without the diff: {baseline}",
                    }
                else:
                    judged = check_diff(
                        repo, snapshot.commit, parsed, accepted_tests, config.sandbox, isolation
                    )
                    check = {"verdict": judged.verdict, "reason": judged.reason[:600]}
                checks.put(check_key, check)
            items.append({**base, "diff": parsed.text, **check})
    lane.check_failures()
    content_hash = write_partition(
        store, "refactor_proposals", context.partition_key, {"results.json": items}
    )
    counts = Counter(item["verdict"] for item in items)
    accepted = counts.get("accepted", 0)
    return MaterializeResult(
        metadata={
            "proposals": len(items),
            "accepted": accepted,
            "acceptance_rate": ratio(accepted, len(items)),
            **{f"rejected_{verdict}": n for verdict, n in sorted(counts.items()) if verdict != "accepted"},
            "check_memo_hits": checks.hits,
            **lane.metadata(),
            "verdicts": md_table(
                ["repo", "file", "verdict", "reason"],
                [(i["repo"], i["path"], i["verdict"], i["reason"]) for i in items],
            ),
            "artifact_hash": content_hash,
        }
    )

"""`verified_bodies`: rejection sampling (cpu_lane/jobs/verified_bodies.py). The CPU lane writes each of the
day's functions that are not held out and have tests `body_samples` times, in exactly the request of the GPU
lane's held-out repository tasks; a body becomes a "write the body" row only if every test that judges the
function passes with it in place (the real body is kept as well). Answers come back from the lane's response
cache on a re-run, and verdicts from the memo, so a re-run asks nothing and runs nothing."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections import Counter
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, asset

from lanes_pipeline.cpu_lane.assets.common import LaneUsage, day_repos, is_transient, read_results
from lanes_pipeline.cpu_lane.assets.generated_tests import generated_tests
from lanes_pipeline.cpu_lane.assets.repo_snapshot import day_symbols, repo_snapshot
from lanes_pipeline.cpu_lane.batching.batch_models import ItemResult
from lanes_pipeline.cpu_lane.jobs.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.jobs.rows import GeneratedTestRow, tests_by_symbol
from lanes_pipeline.cpu_lane.jobs.verified_bodies import (
    BODIES_VERSION,
    REQUEST_FAILED,
    SampledBody,
    body_requests,
    body_targets,
    judge_target,
)
from lanes_pipeline.cpu_lane.jobs.verified_sampling import TargetTally, kind_yield
from lanes_pipeline.cpu_lane.resources import CpuLaneResource, fail_on_transient_failures
from lanes_pipeline.daily.artifacts import md_table, write_partition
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.sandbox.isolation import detect_isolation
from lanes_pipeline.steps import asset_step

VERIFIED_BODIES = "verified_bodies"


def answer_text(item: ItemResult) -> str | None:
    return item.text if item.status == "ok" else None


def tallies(rows: list[SampledBody]) -> list[TargetTally]:
    """Per target: the samples that came back and those accepted (targets whose tests cannot judge left
    out: nothing was tried on them)."""
    by_target: dict[tuple[str, str], list[SampledBody]] = {}
    for row in rows:
        if row.sample is not None and row.verdict != "untestable":
            by_target.setdefault((row.repo, row.symbol_id), []).append(row)
    return [
        TargetTally(
            target=f"{repo}:{symbol}",
            sampled=sum(r.reason != REQUEST_FAILED for r in found),
            accepted=sum(r.verdict == "accepted" for r in found),
        )
        for (repo, symbol), found in sorted(by_target.items())
    ]


def figures(rows: list[SampledBody]) -> dict[str, Any]:
    counts = Counter(r.verdict for r in rows)
    sampled = kind_yield(tallies(rows))
    return {
        "targets": sum(r.sample is None for r in rows),
        "targets_testable": counts.get("real", 0),
        "bodies_accepted": counts.get("accepted", 0),
        "training_rows": sum(r.trains for r in rows),
        **{f"verdict_{verdict}": n for verdict, n in sorted(counts.items())},
        **{f"bodies/{k}": v for k, v in sampled.model_dump(exclude_none=True).items()},
    }


@asset(
    group_name="cpu_lane",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    deps=[repo_snapshot, day_symbols, generated_tests],
    description="Function bodies sampled from the CPU lane for the day's functions that are not held out, "
    "each kept only if every test that judges the function passes with it (rejection sampling).",
)
@asset_step
def verified_bodies(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
    cpu_lane: CpuLaneResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    config, dataset = settings.pipeline.cpu_assets, settings.pipeline.dataset
    store = artifact_store.store()
    day = context.partition_key
    verdicts = Memo(store, VERIFIED_BODIES)
    accepted_tests = tests_by_symbol(read_results(store, "generated_tests", day, GeneratedTestRow))
    isolation = None
    usage = LaneUsage()
    rows: list[SampledBody] = []
    transient: list[ItemResult] = []
    asked = 0
    for snapshot, location, selection in day_repos(store, day, settings) if config.body_samples else []:
        if selection is None or snapshot.commit is None:
            continue
        targets = body_targets(
            snapshot.repo,
            location,
            snapshot.commit,
            selection.targets(),
            selection.today.test_sources,
            accepted_tests.get(snapshot.repo, {}),
            dataset.held_out_percent,
        )
        if not targets:
            continue
        requests = [
            body_requests(
                t, dataset.system_prompt, config.body_samples, config.body_temperature, config.body_max_tokens
            )
            for t in targets
        ]
        result = cpu_lane.run_batch(
            [r for per_target in requests for r in per_target],
            log=context.log,
            label=f"verified_bodies {snapshot.repo}",
        )
        usage.add(result)
        asked += len(result.results)
        items = {item.id: item for item in result.results}
        isolation = isolation or detect_isolation()
        for target, per_target in zip(targets, requests, strict=True):
            answered = [items[r.id] for r in per_target]
            transient += [i for i in answered if is_transient(i)]
            answers = [(r.seed or 0, answer_text(i)) for r, i in zip(per_target, answered, strict=True)]
            target_json, limits = target.model_dump(mode="json"), config.sandbox.model_dump()
            key = memo_key(VERIFIED_BODIES, BODIES_VERSION, target_json, answers, limits)
            remembered = verdicts.get(key)
            if remembered is None:
                found = judge_target(target, answers, config.sandbox, isolation)
                if not any(is_transient(i) for i in answered):  # a failed request is asked again next run
                    verdicts.put(key, [r.model_dump(mode="json") for r in found])
            else:
                found = [SampledBody.model_validate(r) for r in remembered]
            rows += found
    fail_on_transient_failures(
        VERIFIED_BODIES, transient, asked, cpu_lane.config.max_failure_ratio, usage.metadata(verdicts.hits)
    )
    content_hash = write_partition(
        store, VERIFIED_BODIES, day, {"results.json": [r.model_dump(mode="json") for r in rows]}
    )
    return MaterializeResult(
        metadata={
            **figures(rows),
            "body_samples": config.body_samples,
            "verdict_memo_hits": verdicts.hits,
            **usage.metadata(verdicts.hits),
            "verdicts": md_table(
                ["repo", "symbol", "sample", "verdict", "reason"],
                [
                    (r.repo, r.symbol_id, "real" if r.sample is None else str(r.sample), r.verdict, r.reason)
                    for r in rows
                ],
            ),
            "artifact_hash": content_hash,
        }
    )

"""`generated_tests`: pytest tests with teeth, symbol by symbol (tests_day.py): each day's new and changed
symbols first, then up to `backlog_per_day` never-covered ones; `samples_per_item` answers per symbol, each
the model's example calls of the symbol run in the sandbox at the snapshot commit and written down as
regression oracles (observed values as the expected ones). A test is accepted only if it passes every
sandbox run AND fails on both mutants of its symbol; every rejection keeps its reason. The day's symbols
are day_symbols' choice; answers and results are remembered, so a re-run asks nothing and runs nothing.
Coverage of each repository (symbols, covered so far, with an accepted test) goes into the metadata and
`test_coverage/<day>/coverage.json` (which `lanes status` reads)."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections import Counter
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, asset

from lanes_pipeline.cpu_lane.assets.common import LaneUsage, day_repos, is_transient, ratio
from lanes_pipeline.cpu_lane.assets.repo_analysis import repo_analysis
from lanes_pipeline.cpu_lane.assets.repo_snapshot import day_symbols, repo_snapshot
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.cpu_lane.jobs.oracle_tests import SymbolTestResult
from lanes_pipeline.cpu_lane.jobs.rows import GeneratedTestRow, GeneratedTestsFigures
from lanes_pipeline.cpu_lane.jobs.tests_day import (
    COVERAGE_FILE,
    COVERAGE_FOLDER,
    SymbolTestCoverage,
    SymbolTestDay,
    SymbolTestsConfig,
)
from lanes_pipeline.cpu_lane.jobs.verified_sampling import kind_yield
from lanes_pipeline.cpu_lane.resources import CpuLaneResource, fail_on_transient_failures
from lanes_pipeline.daily.artifacts import md_table, write_partition
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.sandbox.isolation import Isolation, detect_isolation
from lanes_pipeline.steps import asset_step

# Which rejection stands for a symbol without an accepted test: the one that got furthest.
_FURTHEST = (
    "survives_mutant",
    "fails_on_commit",
    "no_usable_result",
    "probe_failed",
    "rejected_static",
    "no_calls",
    "no_answer",
)


def symbol_row(repo: str, result: SymbolTestResult) -> GeneratedTestRow:
    """One row per symbol: its longest accepted test, or the rejection that got furthest, with its reason."""
    base = {
        "repo": repo,
        "path": result.path,
        "module": result.module,
        "symbol": result.name,
        "test_file": result.test_file,
        "sampled": len(result.answers),
        "accepted_answers": sum(a.accepted for a in result.answers),
        "reviewer_refusals": sum(a.reviewer_refusal for a in result.answers),
    }
    if result.accepted_tests:
        code = max(result.accepted_tests, key=len)
        reason = next(a.reason for a in result.answers if a.accepted and a.test_code == code)
        return GeneratedTestRow(**base, code=code, verdict="passed", reason=reason)
    statuses = {a.status: a for a in result.answers}
    worst = next((statuses[s] for s in _FURTHEST if s in statuses), None)
    if worst is None:
        return GeneratedTestRow(**base, code=None, verdict="no_answer", reason="no answer was sampled")
    return GeneratedTestRow(**base, code=worst.test_code, verdict=worst.status, reason=worst.reason[:600])


def coverage_table(coverage: list[SymbolTestCoverage]) -> Any:
    return md_table(
        [
            "repo",
            "symbols",
            "covered",
            "with accepted test",
            "share",
            "changed today",
            "backlog today",
            "remaining",
            "not scanned",
            "no environment",
        ],
        [
            (
                c.repo,
                c.symbols,
                c.covered,
                c.with_accepted_test,
                f"{c.share():.0%}",
                c.changed_today,
                c.backlog_today,
                c.remaining,
                len(c.left_out),
                c.environment,
            )
            for c in coverage
        ],
    )


@asset(
    group_name="cpu_lane",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    # After repo_analysis, though it reads none of it: both report coverage from the registers, in one order.
    deps=[repo_snapshot, day_symbols, repo_analysis],
    description="Generated pytest tests per symbol (changed symbols, then the coverage backlog): regression "
    "oracles sampled per symbol, accepted after passing repeated sandbox runs and failing on both mutants.",
)
@asset_step
def generated_tests(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
    cpu_lane: CpuLaneResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    config = settings.pipeline.cpu_assets
    store = artifact_store.store()
    job = SymbolTestsConfig(
        model=cpu_lane.config.model,
        samples=config.samples_per_item,
        limits=config.sandbox,
        max_tokens=config.tests_max_tokens,
    )
    results_memo = Memo(store, "symbol_tests")
    day = SymbolTestDay(results_memo, Memo(store, "tests_register"), job, settings.data_dir)
    isolation: list[Isolation] = []

    def detected() -> Isolation:
        if not isolation:
            isolation.append(detect_isolation())
        return isolation[0]

    items: list[GeneratedTestRow] = []
    results: list[SymbolTestResult] = []
    coverage: list[SymbolTestCoverage] = []
    for snapshot, location, selection in day_repos(store, context.partition_key, settings):
        label = f"generated_tests {snapshot.repo}"
        found, covered = day.run(
            snapshot,
            location,
            selection,
            lambda requests, label=label: cpu_lane.run_batch(requests, log=context.log, label=label),
            detected,
        )
        results += found
        items += [symbol_row(snapshot.repo, r) for r in found]
        if covered is not None:
            coverage.append(covered)
    usage = LaneUsage()
    for batch in day.batches:
        usage.add(batch)
    transient = [i for b in day.batches for i in b.failed() if is_transient(i)]
    fail_on_transient_failures(
        "generated_tests",
        transient,
        day.asked,
        cpu_lane.config.max_failure_ratio,
        usage.metadata(results_memo.hits),
    )
    content_hash = write_partition(
        store,
        "generated_tests",
        context.partition_key,
        {"results.json": [i.model_dump(mode="json") for i in items]},
    )
    # Coverage counts what every day so far covered, so a backfill of an old day sees more of it: it lives
    # beside the partition, outside the day's content (whose hash a re-run or backfill must reproduce).
    write_partition(
        store,
        COVERAGE_FOLDER,
        context.partition_key,
        {COVERAGE_FILE: [c.model_dump(mode="json") for c in coverage]},
    )
    counts = Counter(item.verdict for item in items)
    accepted = counts.get("passed", 0)
    sampled = kind_yield([r.tally for r in results])
    symbols = sum(c.symbols for c in coverage)
    with_test = sum(c.with_accepted_test for c in coverage)
    not_importable = [f"{c.repo}: {why}" for c in coverage for why in c.import_problems.values()]
    for line in not_importable:
        context.log.warning(f"generated_tests {line}")
    return MaterializeResult(
        metadata={
            **GeneratedTestsFigures(
                candidates=len(items),
                accepted=accepted,
                acceptance_rate=ratio(accepted, len(items)),
                sandbox_runs=day.verified,
                verdict_memo_hits=results_memo.hits,
                symbols=symbols,
                symbols_with_accepted_test=with_test,
                test_coverage=ratio(with_test, symbols),
                modules_not_importable=len(not_importable),
                import_problem=not_importable[0] if not_importable else "",
            ).metadata(),
            **{f"rejected_{verdict}": n for verdict, n in sorted(counts.items()) if verdict != "passed"},
            **{f"tests/{k}": v for k, v in sampled.model_dump(exclude_none=True).items()},
            "coverage": coverage_table(coverage),
            "asked_this_run": day.asked,
            **usage.metadata(results_memo.hits),
            "verdicts": md_table(
                ["repo", "symbol", "verdict", "accepted / sampled", "reason"],
                [
                    (
                        i.repo,
                        f"{i.path}::{i.symbol}",
                        i.verdict,
                        f"{i.accepted_answers}/{i.sampled}",
                        i.reason,
                    )
                    for i in items
                ],
            ),
            "artifact_hash": content_hash,
        }
    )

"""`generated_docs`: docstrings with usage examples, symbol by symbol (docstring_day), for the symbols
generated_tests took that day (changed first, then the backlog) whose docstring is missing or lacks its
parameters or an example (what the author wrote is kept verbatim and only extended); `samples_per_item`
answers per symbol, each accepted only if it names every parameter, states nothing its code does not bear
out (docstring_facts: Args, Raises, Returns, summary) and its examples pass as doctests in the repository's
environment inside the sandbox at the snapshot commit; the row lists the checks it passed. Accepted
docstrings come with the symbol as documented (a training row of lora_dataset) and the diff of its file.
Answers and verdicts are remembered, so a re-run asks nothing and runs nothing."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections import Counter
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, asset

from lanes_pipeline.cpu_lane.assets.common import LaneUsage, is_transient, ratio, read_results
from lanes_pipeline.cpu_lane.assets.generated_tests import generated_tests
from lanes_pipeline.cpu_lane.assets.repo_snapshot import repo_snapshot
from lanes_pipeline.cpu_lane.jobs.docstring_day import DocsConfig, DocsCoverage, DocsDay, DocsResult
from lanes_pipeline.cpu_lane.jobs.docstrings import FURTHEST, REVIEWER_REFUSALS
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.cpu_lane.jobs.rows import GeneratedDocRow, GeneratedDocsFigures, GeneratedTestRow
from lanes_pipeline.cpu_lane.jobs.verified_sampling import kind_yield
from lanes_pipeline.cpu_lane.resources import CpuLaneResource, fail_on_transient_failures
from lanes_pipeline.daily.artifacts import md_table, write_partition
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.repos.location import repo_location
from lanes_pipeline.repos.snapshot import load_snapshots
from lanes_pipeline.sandbox.isolation import Isolation, detect_isolation
from lanes_pipeline.steps import asset_step


def doc_row(repo: str, result: DocsResult) -> GeneratedDocRow:
    """One row per symbol: its longest accepted docstring, or the rejection that got furthest."""
    base = {
        "repo": repo,
        "path": result.path,
        "module": result.module,
        "symbol": result.name,
        "sampled": len(result.answers),
        "accepted_answers": sum(a.accepted for a in result.answers),
        "reviewer_refusals": sum(a.status in REVIEWER_REFUSALS for a in result.answers),
    }
    accepted = [a for a in result.answers if a.accepted]
    if accepted:
        best = max(accepted, key=lambda a: len(a.docstring or ""))
    else:
        statuses = {a.status: a for a in result.answers}
        worst = next((statuses[s] for s in FURTHEST if s in statuses), None)
        if worst is None:
            return GeneratedDocRow(**base, verdict="no_answer", reason="no answer was sampled")
        best = worst
    return GeneratedDocRow(
        **base,
        verdict=best.status,
        reason=best.reason[:600],
        docstring=best.docstring,
        documented=best.documented,
        diff=best.diff,
        checks=best.checks,
    )


def symbols_tested(rows: list[GeneratedTestRow]) -> dict[str, list[str]]:
    """repo -> the symbol ids generated_tests took that day, in its order (changed first, then backlog)."""
    found: dict[str, list[str]] = {}
    for row in rows:
        if row.symbol is not None:
            found.setdefault(row.repo, []).append(f"{row.path}::{row.symbol}")
    return found


def coverage_table(coverage: list[DocsCoverage]) -> Any:
    return md_table(
        ["repo", "symbols", "with accepted docstring", "asked today", "documented already", "no environment"],
        [
            (c.repo, c.symbols, c.with_accepted_docs, c.asked_today, c.already_documented, c.environment)
            for c in coverage
        ],
    )


@asset(
    group_name="cpu_lane",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    deps=[repo_snapshot, generated_tests],
    description="Docstrings with usage examples for the day's symbols whose docstring is missing or "
    "incomplete (generated_tests' selection; the author's words kept verbatim): sampled per symbol, "
    "accepted when they name every parameter, state nothing the code does not bear out and their "
    "examples pass as doctests in the sandbox.",
)
@asset_step
def generated_docs(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
    cpu_lane: CpuLaneResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    config = settings.pipeline.cpu_assets
    store = artifact_store.store()
    day = context.partition_key
    job = DocsConfig(
        model=cpu_lane.config.model,
        samples=config.samples_per_item,
        limits=config.sandbox,
        # The symbol jobs share one answer budget: a docstring with examples is as long as a test.
        max_tokens=config.tests_max_tokens,
    )
    results_memo = Memo(store, "symbol_docs")
    docs = DocsDay(results_memo, Memo(store, "docs_register"), job, settings.data_dir)
    chosen = symbols_tested(read_results(store, "generated_tests", day, GeneratedTestRow))
    entries = {e.name: e for e in settings.repos.repos}
    isolation: list[Isolation] = []

    def detected() -> Isolation:
        if not isolation:
            isolation.append(detect_isolation())
        return isolation[0]

    rows: list[GeneratedDocRow] = []
    results: list[DocsResult] = []
    coverage: list[DocsCoverage] = []
    for snapshot in load_snapshots(store, day):
        label = f"generated_docs {snapshot.repo}"
        found, covered = docs.run(
            snapshot,
            repo_location(settings, entries[snapshot.repo]),
            chosen.get(snapshot.repo, []),
            lambda requests, label=label: cpu_lane.run_batch(requests, log=context.log, label=label),
            detected,
        )
        results += found
        rows += [doc_row(snapshot.repo, r) for r in found]
        if covered is not None:
            coverage.append(covered)
    usage = LaneUsage()
    for batch in docs.batches:
        usage.add(batch)
    transient = [i for b in docs.batches for i in b.failed() if is_transient(i)]
    fail_on_transient_failures(
        "generated_docs",
        transient,
        docs.asked,
        cpu_lane.config.max_failure_ratio,
        usage.metadata(results_memo.hits),
    )
    content_hash = write_partition(
        store, "generated_docs", day, {"results.json": [r.model_dump(mode="json") for r in rows]}
    )
    counts = Counter(row.verdict for row in rows)
    accepted = counts.get("accepted", 0)
    sampled = kind_yield([r.tally for r in results])
    symbols = sum(c.symbols for c in coverage)
    with_docs = sum(c.with_accepted_docs for c in coverage)
    return MaterializeResult(
        metadata={
            **GeneratedDocsFigures(
                candidates=len(rows),
                accepted=accepted,
                acceptance_rate=ratio(accepted, len(rows)),
                sandbox_runs=docs.verified,
                verdict_memo_hits=results_memo.hits,
                symbols=symbols,
                symbols_with_accepted_docs=with_docs,
                docs_coverage=ratio(with_docs, symbols),
            ).metadata(),
            **{f"rejected_{verdict}": n for verdict, n in sorted(counts.items()) if verdict != "accepted"},
            **{f"docs/{k}": v for k, v in sampled.model_dump(exclude_none=True).items()},
            "coverage": coverage_table(coverage),
            "asked_this_run": docs.asked,
            **usage.metadata(results_memo.hits),
            "verdicts": md_table(
                ["repo", "symbol", "verdict", "accepted / sampled", "reason"],
                [
                    (
                        r.repo,
                        f"{r.path}::{r.symbol}",
                        r.verdict,
                        f"{r.accepted_answers}/{r.sampled}",
                        r.reason,
                    )
                    for r in rows
                ],
            ),
            "artifact_hash": content_hash,
        }
    )

"""`repo_analysis`: a structured analysis (summary, public API, risks, test ideas) of each of the day's
symbols from the CPU lane. The day's symbols are the new and changed ones first, then the coverage backlog
(the `day_symbols` asset's choice, which generated_tests and refactor_proposals take too), so a module of
any size is covered symbol by symbol. Each answer is remembered by the symbol's memo key (its source plus
context): editing one function of a big module re-asks only that function, and a re-run asks nothing and
writes the same bytes. Only a file Python cannot parse has no symbols: it is listed with the reason
(`not_scanned`). Coverage per repository (analysed, with an accepted test, with an accepted proposal) goes
into the metadata."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections.abc import Sequence
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.assets.by_symbol import (
    COVERAGE,
    CoverageRegister,
    Send,
    SymbolQuestions,
    coverage_table,
    repo_coverage,
)
from lanes_pipeline.cpu_lane.assets.common import day_repos, ratio
from lanes_pipeline.cpu_lane.assets.repo_snapshot import day_symbols, repo_snapshot
from lanes_pipeline.cpu_lane.batching.batch_models import DETERMINISTIC_FAILURES, ItemResult
from lanes_pipeline.cpu_lane.jobs.analysis_checks import analysis_problem
from lanes_pipeline.cpu_lane.jobs.backlog import RepoCoverage
from lanes_pipeline.cpu_lane.jobs.day_selection import DaySelection
from lanes_pipeline.cpu_lane.jobs.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.jobs.rows import AnalysisAnswer, AnalysisFigures, AnalysisRow, FileAnalysisRow
from lanes_pipeline.cpu_lane.jobs.tasks import (
    SYMBOL_ANALYSIS,
    TASKS_VERSION,
    FileAnalysis,
)
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.artifacts import md_table, write_partition
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.repos.symbols import Symbol
from lanes_pipeline.steps import asset_step


def analysis_key(model: str, symbol: Symbol, max_tokens: int) -> str:
    return memo_key("symbol_analysis", TASKS_VERSION, model, symbol.memo_key, max_tokens)


def analysis_value(item: ItemResult) -> dict[str, Any]:
    """What a symbol's analysis remembers (an AnalysisAnswer): the validated analysis, or why not."""
    if item.status == "ok":
        answer = AnalysisAnswer(status="ok", analysis=FileAnalysis.model_validate(item.parsed))
    elif item.failure is not None and item.failure.kind in DETERMINISTIC_FAILURES:
        answer = AnalysisAnswer(status=item.failure.kind, reason=item.failure.reason[:300])
    else:
        answer = AnalysisAnswer(
            status="failed", reason=(item.failure.reason if item.failure else "no answer")[:300]
        )
    return answer.model_dump()


def symbol_row(symbol: Symbol, blob: str, answer: AnalysisAnswer) -> FileAnalysisRow:
    """A symbol's row: its answer, and for an analysis whether it is accepted (analysis_checks) and why
    not."""
    row = FileAnalysisRow(path=symbol.path, blob=blob, symbol=symbol.name, **answer.model_dump())
    if answer.analysis is None:
        return row
    problem = analysis_problem(answer.analysis, symbol)
    return row.model_copy(update={"accepted": problem is None, "reason": problem or ""})


class AnalysisDay:
    """repo_analysis on one repository for one day: the day's symbols, asked through `questions`."""

    def __init__(
        self,
        questions: SymbolQuestions,
        tests_register: Memo,
        register: CoverageRegister,
        model: str,
        max_tokens: int,
    ) -> None:
        self.questions, self.tests_register, self.register = questions, tests_register, register
        self.model, self.max_tokens = model, max_tokens
        self.not_scanned: list[tuple[str, str, str]] = []  # (repo, path, why): files without symbols
        self.skipped: dict[str, str] = {}  # `repo: symbol id` -> why the pipeline cannot handle it

    def run(
        self, snapshot: Snapshot, selection: DaySelection | None, send: Send
    ) -> tuple[AnalysisRow, RepoCoverage | None]:
        """`selection`: the day's symbols (day_symbols); None for a repository without a commit yet."""
        if snapshot.commit is None or selection is None:
            return AnalysisRow(repo=snapshot.repo, commit=None, files=[]), None
        targets = selection.targets()
        self.not_scanned += [(snapshot.repo, p, why) for p, why in sorted(selection.today.left_out.items())]
        self.skipped |= {f"{snapshot.repo}: {i}": why for i, why in sorted(selection.today.skipped.items())}
        keys = {s.id: analysis_key(self.model, s, self.max_tokens) for s in targets}
        known = self.questions.answers(
            snapshot.repo,
            snapshot.repo_map,
            targets,
            keys,
            SYMBOL_ANALYSIS,
            self.max_tokens,
            analysis_value,
            send,
        )
        blobs = {f.path: f.blob for f in snapshot.files}
        rows = [symbol_row(s, blobs[s.path], AnalysisAnswer.model_validate(known[s.id])) for s in targets]
        accepted = {s.memo_key for s, r in zip(targets, rows, strict=True) if r.accepted}
        self.register.add(snapshot.repo, accepted)
        proposed = CoverageRegister(self.register.memo, "refactor").accepted(snapshot.repo)
        analysed = self.register.accepted(snapshot.repo)
        covered = repo_coverage(
            snapshot.repo, selection.today.symbols, analysed, self.tests_register, proposed
        )
        return AnalysisRow(repo=snapshot.repo, commit=snapshot.commit, files=rows), covered


def render_report(repos: list[AnalysisRow]) -> str:
    """The day's analysis as Markdown: one section per symbol."""
    lines = []
    for repo in repos:
        lines.append(f"## {repo.repo} @ {(repo.commit or 'no commit')[:12]}")
        for item in repo.files:
            where = f"{item.path}::{item.symbol}" if item.symbol else item.path
            lines.append(f"### {where} ({item.status})")
            analysis = item.analysis
            if analysis:
                lines.append(analysis.summary)
                lines += [f"- API: `{name}`" for name in analysis.public_api]
                lines += [f"- Risk: {risk}" for risk in analysis.risks]
                lines += [f"- Test idea: {idea}" for idea in analysis.test_ideas]
            elif item.reason:
                lines.append(f"_{item.reason}_")
    return "\n\n".join(lines) + "\n"


def figures(repos: list[AnalysisRow], coverage: Sequence[RepoCoverage]) -> AnalysisFigures:
    items = [f for r in repos for f in r.files]
    statuses = [f.status for f in items]
    accepted = sum(bool(f.accepted) for f in items)
    symbols = sum(c.symbols for c in coverage)
    analysed = sum(c.analysed for c in coverage)
    return AnalysisFigures(
        items=len(items),
        files=len({(r.repo, f.path) for r in repos for f in r.files}),
        analysed_ok=statuses.count("ok"),
        unparseable=statuses.count("unparseable"),
        unparseable_ratio=ratio(statuses.count("unparseable"), len(items)),
        too_long=statuses.count("too_long"),
        failed_transient=statuses.count("failed"),
        accepted=accepted,
        acceptance_rate=ratio(accepted, len(items)),
        symbols=symbols,
        symbols_analysed=analysed,
        analysis_coverage=ratio(analysed, symbols),
    )


@asset(
    group_name="cpu_lane",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    deps=[repo_snapshot, day_symbols],
    description="Per-symbol structured analysis from the CPU lane (changed symbols, then the coverage "
    "backlog); answers remembered by each symbol's source and context.",
)
@asset_step
def repo_analysis(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
    cpu_lane: CpuLaneResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    config = settings.pipeline.cpu_assets
    store = artifact_store.store()
    questions = SymbolQuestions("repo_analysis", Memo(store, "analysis"))
    register = CoverageRegister(Memo(store, COVERAGE), "analysis")
    day = AnalysisDay(
        questions,
        Memo(store, "tests_register"),
        register,
        cpu_lane.config.model,
        config.analysis_max_tokens,
    )
    repos: list[AnalysisRow] = []
    coverage: list[RepoCoverage] = []
    for snapshot, _, selection in day_repos(store, context.partition_key, settings):
        label = f"repo_analysis {snapshot.repo}"
        row, covered = day.run(
            snapshot,
            selection,
            lambda requests, label=label: cpu_lane.run_batch(requests, log=context.log, label=label),
        )
        repos.append(row)
        coverage += [covered] if covered is not None else []
    questions.check_failures(cpu_lane.config.max_failure_ratio)
    report = render_report(repos)
    content_hash = write_partition(
        store,
        "repo_analysis",
        context.partition_key,
        {"results.json": [r.model_dump(mode="json") for r in repos], "report.md": report},
    )
    return MaterializeResult(
        metadata={
            **figures(repos, coverage).metadata(),
            **questions.metadata(),
            "coverage": coverage_table(coverage),
            "not_scanned": md_table(["repo", "path", "why"], day.not_scanned),
            "skipped_symbols": len(day.skipped),
            "skipped": MetadataValue.json(day.skipped),
            "report": MetadataValue.md(report[:60_000]),
            "artifact_hash": content_hash,
        }
    )

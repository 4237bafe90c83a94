"""`refactor_proposals`: small refactors of the day's symbols (day_symbols' choice, as for repo_analysis and
generated_tests: changed symbols, then the coverage backlog), proposed by the CPU lane as unified diffs only
(whole-file rewrites are slow on a collapsed prefix cache and are refused), parsed with unidiff, confined
to the symbol's lines of its file (a hunk that touches any other line is rejected as `outside_symbol`),
checked with `git apply --check` in a sandbox worktree, then accepted only if the repository's own tests
and the day's accepted generated tests all pass with the diff applied. Answers are remembered by the
symbol's memo key, verdicts by the diff, commit and tests they ran with."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, MaterializeResult, asset

from lanes_pipeline.cpu_lane.assets.by_symbol import (
    COVERAGE,
    CoverageRegister,
    Send,
    SymbolQuestions,
    coverage_table,
    repo_coverage,
)
from lanes_pipeline.cpu_lane.assets.common import day_repos, ratio, read_results, remembered_answer
from lanes_pipeline.cpu_lane.assets.generated_tests import generated_tests
from lanes_pipeline.cpu_lane.assets.repo_snapshot import day_symbols, repo_snapshot
from lanes_pipeline.cpu_lane.jobs.backlog import RepoCoverage
from lanes_pipeline.cpu_lane.jobs.day_selection import DaySelection
from lanes_pipeline.cpu_lane.jobs.diff_judge import DiffJudge, DiffScope
from lanes_pipeline.cpu_lane.jobs.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.jobs.rows import GeneratedTestRow, RefactorFigures, RefactorRow, RememberedAnswer
from lanes_pipeline.cpu_lane.jobs.tasks import SYMBOL_REFACTOR, TASKS_VERSION
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.artifacts import md_table, write_partition
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.git import read_blobs
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.repos.symbols import Symbol
from lanes_pipeline.steps import asset_step


def refactor_key(model: str, symbol: Symbol, max_tokens: int) -> str:
    return memo_key("symbol_refactor", TASKS_VERSION, model, symbol.memo_key, max_tokens)


class RefactorDay:
    """refactor_proposals on one repository for one day: the day's symbols asked through `questions`,
    each answer judged by `judge` within its symbol's lines."""

    def __init__(
        self,
        questions: SymbolQuestions,
        judge: DiffJudge,
        tests_register: Memo,
        register: CoverageRegister,
        model: str,
        max_tokens: int,
    ) -> None:
        self.questions, self.judge, self.register = questions, judge, register
        self.tests_register = tests_register
        self.model, self.max_tokens = model, max_tokens

    def run(
        self,
        snapshot: Snapshot,
        repo: Path,
        selection: DaySelection | None,
        tests: Sequence[GeneratedTestRow],
        send: Send,
    ) -> tuple[list[RefactorRow], RepoCoverage | None]:
        """`selection`: the day's symbols (day_symbols); None for a repository without a commit yet."""
        if snapshot.commit is None or selection is None:
            return [], None
        targets = selection.targets()
        keys = {s.id: refactor_key(self.model, s, self.max_tokens) for s in targets}
        known = self.questions.answers(
            snapshot.repo,
            snapshot.repo_map,
            targets,
            keys,
            SYMBOL_REFACTOR,
            self.max_tokens,
            remembered_answer,
            send,
        )
        blobs = {f.path: f.blob for f in snapshot.files}
        texts = {b: t.decode("utf-8") for b, t in read_blobs(repo, {blobs[s.path] for s in targets}).items()}
        scopes = {s.id: DiffScope(symbol=s, file_source=texts[blobs[s.path]]) for s in targets}
        answers = {s.id: RememberedAnswer.read(known[s.id]) for s in targets}
        rows = self.judge.rows(snapshot.repo, repo, snapshot.commit, tests, answers, scopes)
        accepted = {s.memo_key for s, r in zip(targets, rows, strict=True) if r.accepted}
        self.register.add(snapshot.repo, accepted)
        analysed = CoverageRegister(self.register.memo, "analysis").accepted(snapshot.repo)
        proposed = self.register.accepted(snapshot.repo)
        symbols = selection.today.symbols
        covered = repo_coverage(snapshot.repo, symbols, analysed, self.tests_register, proposed)
        return rows, covered


def figures(items: list[RefactorRow], checks: Memo, coverage: Sequence[RepoCoverage]) -> dict[str, Any]:
    """The asset's figures, and a count per rejection verdict (`rejected_<verdict>`)."""
    counts = Counter(item.verdict for item in items)
    accepted = counts.get("accepted", 0)
    symbols = sum(c.symbols for c in coverage)
    proposed = sum(c.with_accepted_proposal for c in coverage)
    return {
        **RefactorFigures(
            proposals=len(items),
            accepted=accepted,
            acceptance_rate=ratio(accepted, len(items)),
            check_memo_hits=checks.hits,
            symbols=symbols,
            symbols_with_accepted_proposal=proposed,
            proposal_coverage=ratio(proposed, symbols),
        ).metadata(),
        **{f"rejected_{verdict}": n for verdict, n in sorted(counts.items()) if verdict != "accepted"},
    }


@asset(
    group_name="cpu_lane",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    deps=[repo_snapshot, day_symbols, generated_tests],
    description="Refactors of the day's symbols as unified diffs confined to each symbol's lines, accepted "
    "only if they apply and every test passes with them.",
)
@asset_step
def refactor_proposals(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
    cpu_lane: CpuLaneResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    config = settings.pipeline.cpu_assets
    store = artifact_store.store()
    questions = SymbolQuestions("refactor_proposals", Memo(store, "refactor_diff"))
    checks = Memo(store, "diff_check")
    day = RefactorDay(
        questions,
        DiffJudge(checks, config.sandbox),
        Memo(store, "tests_register"),
        CoverageRegister(Memo(store, COVERAGE), "refactor"),
        cpu_lane.config.model,
        config.refactor_max_tokens,
    )
    tests = read_results(store, "generated_tests", context.partition_key, GeneratedTestRow)
    items: list[RefactorRow] = []
    coverage: list[RepoCoverage] = []
    for snapshot, location, selection in day_repos(store, context.partition_key, settings):
        label = f"refactor_proposals {snapshot.repo}"
        rows, covered = day.run(
            snapshot,
            location,
            selection,
            tests,
            lambda requests, label=label: cpu_lane.run_batch(requests, log=context.log, label=label),
        )
        items += rows
        coverage += [covered] if covered is not None else []
    questions.check_failures(cpu_lane.config.max_failure_ratio)
    content_hash = write_partition(
        store,
        "refactor_proposals",
        context.partition_key,
        {"results.json": [i.model_dump(mode="json") for i in items]},
    )
    return MaterializeResult(
        metadata={
            **figures(items, checks, coverage),
            **questions.metadata(),
            "coverage": coverage_table(coverage),
            "verdicts": md_table(
                ["repo", "file", "symbol", "verdict", "reason"],
                [(i.repo, i.path, i.symbol or "", i.verdict, i.reason) for i in items],
            ),
            "artifact_hash": content_hash,
        }
    )

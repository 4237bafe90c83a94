"""`accepted_work`: the day's verified CPU-lane results in the dataset contract's terms (dataset/writer.py's
AcceptedWork), the one thing the dataset reads from the CPU lane: explain <- accepted analyses, write tests
<- accepted tests, write docs <- accepted docstrings, propose a diff <- accepted diffs, write the body <-
verified bodies, each with the code it answers at the day's commit; and the accepted tests of each symbol,
which judge the held-out tasks."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from pathlib import Path

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.assets.common import read_results
from lanes_pipeline.cpu_lane.assets.generated_docs import generated_docs
from lanes_pipeline.cpu_lane.assets.generated_tests import generated_tests
from lanes_pipeline.cpu_lane.assets.refactor_proposals import refactor_proposals
from lanes_pipeline.cpu_lane.assets.repo_analysis import repo_analysis
from lanes_pipeline.cpu_lane.assets.repo_snapshot import repo_snapshot
from lanes_pipeline.cpu_lane.assets.verified_bodies import verified_bodies
from lanes_pipeline.cpu_lane.jobs.analysis_checks import (
    MIN_PRECISION,
    analysis_problem,
    gate_precision,
    load_labels,
)
from lanes_pipeline.cpu_lane.jobs.docstrings import docs_candidates
from lanes_pipeline.cpu_lane.jobs.exception_tests import unintended_exception_problem
from lanes_pipeline.cpu_lane.jobs.rows import (
    AnalysisRow,
    GeneratedDocRow,
    GeneratedTestRow,
    RefactorRow,
    tests_by_symbol,
)
from lanes_pipeline.cpu_lane.jobs.tasks import FileAnalysis
from lanes_pipeline.cpu_lane.jobs.verified_bodies import SampledBody
from lanes_pipeline.daily.artifacts import write_partition
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.dataset.contract import TASKS
from lanes_pipeline.dataset.holdout_rules import symbol_with_context
from lanes_pipeline.dataset.writer import ACCEPTED_FILE, ACCEPTED_WORK, AcceptedWork, Candidate
from lanes_pipeline.git import read_blobs
from lanes_pipeline.repos.location import located_snapshots
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.repos.symbols import Symbol, all_symbols, scan_repo
from lanes_pipeline.steps import asset_step


def explanation(analysis: FileAnalysis) -> str:
    """An accepted analysis as the assistant's answer to "explain this code"."""
    parts = [f"Summary: {analysis.summary.strip()}"]
    if analysis.public_api:
        parts.append("Public API: " + ", ".join(analysis.public_api))
    if analysis.risks:
        parts.append("Risks:\n" + "\n".join(f"- {r}" for r in analysis.risks))
    if analysis.test_ideas:
        parts.append("Test ideas:\n" + "\n".join(f"- {t}" for t in analysis.test_ideas))
    parts.append(f"Complexity: {analysis.complexity}")
    return "\n".join(parts)


def candidates_of_day(
    analyses: list[AnalysisRow],
    tests: list[GeneratedTestRow],
    diffs: list[RefactorRow],
    changed: dict[str, set[str]],
    sources: dict[tuple[str, str], str],
) -> list[Candidate]:
    """Accepted results only: analyses (of the day's symbols, or of files changed that day in rows written
    before analysis went by symbol), passing tests, accepted diffs. Pure. A row accepted on an older day
    that today's checks refuse (an analysis the code contradicts, a test of an exception its target does
    not raise on purpose) is no candidate."""
    found: list[Candidate] = []
    for repo in analyses:
        symbols = _symbols_of(repo.repo, sources) if any(f.symbol for f in repo.files) else {}
        for item in repo.files:
            if not item.accepted or item.analysis is None:
                continue
            source = sources[(repo.repo, item.path)]
            if item.symbol is None:
                if item.path in changed.get(repo.repo, set()):
                    found.append(
                        Candidate(
                            task="explain",
                            repo=repo.repo,
                            path=item.path,
                            code=source,
                            answer=explanation(item.analysis),
                        )
                    )
                continue
            symbol = symbols.get((item.path, item.symbol))
            # Gone from the file since it was analysed: nothing to show. Accepted before today's checks
            # and refused by them: what the review would refuse does not train either.
            if symbol is not None and analysis_problem(item.analysis, symbol) is None:
                shown = symbol_with_context(symbol)
                found.append(
                    Candidate(
                        task="explain",
                        repo=repo.repo,
                        path=item.path,
                        code=shown,
                        answer=explanation(item.analysis),
                        symbol=item.symbol,
                        code_is_file=False,
                    )
                )
    for test in tests:
        source = sources.get((test.repo, test.path), "")
        if test.accepted and test.code is not None and not _unintended(test.code, source, test.symbol):
            found.append(
                Candidate(
                    task="write_tests",
                    repo=test.repo,
                    path=test.path,
                    code=sources[(test.repo, test.path)],
                    answer=f"```python\n{test.code.rstrip()}\n```",
                    symbol=test.symbol,
                )
            )
    for diff in diffs:
        if diff.accepted and diff.diff is not None:
            found.append(
                Candidate(
                    task="refactor_diff",
                    repo=diff.repo,
                    path=diff.path,
                    code=sources[(diff.repo, diff.path)],
                    answer=f"```diff\n{diff.diff.rstrip()}\n```",
                    symbol=diff.symbol,
                )
            )
    return found


def _unintended(code: str, source: str, symbol: str | None) -> bool:
    """Whether a test accepted before the exception check expects what its target never raises on purpose
    (a test of a whole file, from before tests went by symbol, names no target to hold it against)."""
    if symbol is None:
        return False
    try:
        return unintended_exception_problem(code, source, symbol) is not None
    except SyntaxError:
        return True  # the file as committed does not parse: nothing to teach from


def body_candidates(bodies: list[SampledBody]) -> list[Candidate]:
    """The verified bodies that train (each accepted sample, and the real body of each function whose tests
    can judge one) as "write the body" rows: the same request as the repository tasks. Pure."""
    return [
        Candidate(
            task="write_body",
            repo=body.repo,
            path=body.path,
            code=body.request,
            answer=f"```python\n{body.body.rstrip()}\n```",
            symbol=body.symbol,
            code_is_file=False,
        )
        for body in bodies
        if body.trains and body.body is not None
    ]


def _symbols_of(repo: str, sources: dict[tuple[str, str], str]) -> dict[tuple[str, str], Symbol]:
    """(path, name) -> symbol, scanned with the whole repository (callees' context crosses modules)."""
    scans = scan_repo({path: text for (name, path), text in sources.items() if name == repo})
    return {(s.path, s.name): s for s in all_symbols(scans)}


def day_sources(located: list[tuple[Snapshot, Path]]) -> dict[tuple[str, str], str]:
    """(repo, path) -> the file's text at the day's commit, for every file of the day's snapshots."""
    sources: dict[tuple[str, str], str] = {}
    for snapshot, location in located:
        if snapshot.commit is None:
            continue
        blobs = read_blobs(location, [f.blob for f in snapshot.files])
        sources.update({(snapshot.repo, f.path): blobs[f.blob].decode("utf-8") for f in snapshot.files})
    return sources


@asset(
    group_name="cpu_lane",
    # Every asset whose results it reads: the day's snapshots, and the accepted work of each job.
    deps=[repo_snapshot, repo_analysis, generated_tests, refactor_proposals, generated_docs, verified_bodies],
    description="The day's accepted CPU-lane results as dataset candidates (explain, write tests, write "
    "docs, propose a diff, write the body), and each symbol's accepted tests.",
)
@asset_step
def accepted_work(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    store = artifact_store.store()
    day = context.partition_key
    located = located_snapshots(store, day, settings)
    snapshots = [snapshot for snapshot, _ in located]
    sources = day_sources(located)
    generated = read_results(store, "generated_tests", day, GeneratedTestRow)
    candidates = candidates_of_day(
        read_results(store, "repo_analysis", day, AnalysisRow),
        generated,
        read_results(store, "refactor_proposals", day, RefactorRow),
        {s.repo: set(s.changed) for s in snapshots},
        sources,
    )
    candidates += docs_candidates(read_results(store, "generated_docs", day, GeneratedDocRow), sources)
    candidates += body_candidates(read_results(store, "verified_bodies", day, SampledBody))
    # The analysis checks vouch for an explanation only as far as their precision on labelled real
    # analyses goes: below MIN_PRECISION, explanations would teach the adapter nonsense.
    gate = gate_precision(load_labels())
    explanations = sum(c.task == "explain" for c in candidates)
    if not gate.explanations_trained:
        candidates = [c for c in candidates if c.task != "explain"]
        context.log.info(
            f"{explanations} accepted explanation(s) left out of the dataset: the analysis checks' precision "
            f"on {gate.labelled} labelled analyses is {gate.precision}, below {MIN_PRECISION}"
        )
    tests = tests_by_symbol(generated)
    work = AcceptedWork(candidates=candidates, tests=tests)
    content_hash = write_partition(store, ACCEPTED_WORK, day, {ACCEPTED_FILE: work.model_dump(mode="json")})
    return MaterializeResult(
        metadata={
            "candidates": len(candidates),
            **{f"candidates_{task}": sum(c.task == task for c in candidates) for task in TASKS},
            "symbols_with_accepted_tests": sum(len(v) for v in tests.values()),
            "explanations_left_out": 0 if gate.explanations_trained else explanations,
            "analysis_gate": MetadataValue.json(gate.model_dump()),
            "artifact_hash": content_hash,
        }
    )

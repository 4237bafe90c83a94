"""`lora_dataset`: the day's accepted CPU-lane results as chat records for the GPU lane's LoRA
(explain <- accepted analyses, write tests <- accepted tests, write docs <- accepted docstrings, propose a
diff <- accepted diffs) and the user's own new or changed functions (write the body <- the function, see
holdout.py), scrubbed of secrets and prompt injection, deduplicated, fitted to the base model's max sequence
length with its own tokenizer, split by held-out symbol (holdout.py), saved with `datasets` at
`<artifacts>/lora_dataset/<day>/` (the contract in dataset_window.py), plus the replay window's figures."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from datetime import date
from pathlib import Path

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.assets.analysis import repo_analysis
from lanes_pipeline.cpu_lane.assets.common import (
    load_snapshots,
    md_table,
    read_results,
    repo_location,
    write_partition,
)
from lanes_pipeline.cpu_lane.assets.docs import generated_docs
from lanes_pipeline.cpu_lane.assets.refactor import refactor_proposals
from lanes_pipeline.cpu_lane.assets.snapshot import repo_snapshot
from lanes_pipeline.cpu_lane.assets.tests import generated_tests
from lanes_pipeline.cpu_lane.jobs.docstrings import docs_candidates
from lanes_pipeline.cpu_lane.jobs.rows import (
    AnalysisRow,
    DatasetFigures,
    GeneratedDocRow,
    GeneratedTestRow,
    RefactorRow,
)
from lanes_pipeline.cpu_lane.jobs.tasks import FileAnalysis
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.dataset import window as dataset_window
from lanes_pipeline.dataset.held_out import HELD_OUT_FILE, HeldOutDay, RepoHoldOut, held_out_of_repo
from lanes_pipeline.dataset.holdout import body_candidate, route, symbol_with_context
from lanes_pipeline.dataset.writer import Candidate, load_token_counter, save_dataset, shape
from lanes_pipeline.embedded.engines import embedded_hf_model
from lanes_pipeline.errors import about
from lanes_pipeline.git import read_blobs
from lanes_pipeline.host import with_host_figures
from lanes_pipeline.repos.scan import body_text
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.repos.symbols import Symbol, all_symbols, scan_repo
from lanes_pipeline.settings import EMBEDDED, Settings
from lanes_pipeline.store import sha256_tree


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


def base_model_dir(settings: Settings) -> Path:
    if settings.training.base_model_dir == EMBEDDED:
        return embedded_hf_model(settings.data_dir)
    return Path(settings.training.base_model_dir)


def candidates_of_day(
    analyses: list[AnalysisRow],
    tests: list[GeneratedTestRow],
    diffs: list[RefactorRow],
    changed: dict[str, set[str]],
    sources: dict[tuple[str, str], str],
) -> list[Candidate]:
    """Accepted results only: analyses (of the day's symbols, or of files changed that day in rows written
    before analysis went by symbol), passing tests, accepted diffs. Pure."""
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
            if symbol is not None:  # gone from the file since it was analysed: nothing to show
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
        if test.accepted and test.code is not None:
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


def _symbols_of(repo: str, sources: dict[tuple[str, str], str]) -> dict[tuple[str, str], Symbol]:
    """(path, name) -> symbol, scanned with the whole repository (callees' context crosses modules)."""
    scans = scan_repo({path: text for (name, path), text in sources.items() if name == repo})
    return {(s.path, s.name): s for s in all_symbols(scans)}


def tests_by_symbol(rows: list[GeneratedTestRow]) -> dict[tuple[str, str], list[str]]:
    """(repo, symbol name) -> the day's accepted test modules for it."""
    found: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.accepted and row.code is not None and row.symbol is not None:
            found.setdefault((row.repo, row.symbol), []).append(row.code)
    return found


def held_out_of_day(
    context: AssetExecutionContext,
    settings: Settings,
    snapshots: list[Snapshot],
    accepted: dict[tuple[str, str], list[str]],
    nothing_taught_yet: bool,
) -> tuple[HeldOutDay, dict[str, RepoHoldOut]]:
    """The day's held-out tasks, and each repository's split (repo -> held out, tasks, taught)."""
    percent = settings.pipeline.dataset.held_out_percent
    entries = {e.name: e for e in settings.repos.repos}
    day = HeldOutDay(held_out_percent=percent)
    repos: dict[str, RepoHoldOut] = {}
    for snapshot in snapshots:
        if snapshot.commit is None:
            continue
        ours = {name: tests for (repo, name), tests in accepted.items() if repo == snapshot.repo}
        split = held_out_of_repo(
            snapshot,
            repo_location(settings, entries[snapshot.repo]),
            percent,
            ours,
            settings.pipeline.cpu_assets.sandbox,
            teach_all=nothing_taught_yet,
        )
        repos[snapshot.repo] = split
        day.bodies[snapshot.repo] = {}
        for symbol in split.held:
            with about(
                f"held-out symbol {snapshot.repo}: {symbol.id} (lines {symbol.start_line}-{symbol.end_line})"
            ):
                day.bodies[snapshot.repo][symbol.id] = body_text(symbol)
        for symbol_id, reason in sorted(split.skipped.items()):
            context.log.warning(
                f"{snapshot.repo}: {symbol_id} skipped (the day goes on without it): {reason}"
            )
        day.functions.extend(split.functions)
        if split.problem is not None:
            context.log.warning(f"{snapshot.repo}: no held-out task, nothing taught today: {split.problem}")
        context.log.info(
            f"{snapshot.repo}: {len(split.held)} held-out symbol(s), {len(split.functions)} with passing "
            f"tests; {len(split.taught)} new or changed function(s) to write the body of"
        )
    return day, repos


def _routed(candidate: Candidate, split: RepoHoldOut | None) -> Candidate:
    where = f"{candidate.task} row of {candidate.repo}: {candidate.path}" + (
        f"::{candidate.symbol}" if candidate.symbol else ""
    )
    with about(where):
        return route(candidate, split.held, split.unmaskable) if split is not None else route(candidate, [])


def skipped_of(splits: dict[str, RepoHoldOut]) -> dict[str, str]:
    """`repo: symbol id` -> why the day went on without it."""
    return {f"{repo}: {i}": why for repo, split in sorted(splits.items()) for i, why in split.skipped.items()}


def _no_tokens(messages: list[dict[str, str]]) -> int:
    raise AssertionError("no candidate, nothing to count")  # shape() counts candidates only


@asset(
    group_name="cpu_lane",
    # Every asset whose results it reads: the day's snapshots, and the accepted work of each job.
    deps=[repo_snapshot, repo_analysis, generated_tests, refactor_proposals, generated_docs],
    description="Chat-format LoRA dataset of the day's accepted results (train/eval) and the replay window.",
)
@with_host_figures
def lora_dataset(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    store = artifact_store.store()
    day = context.partition_key
    snapshots = load_snapshots(store, day)
    entries = {e.name: e for e in settings.repos.repos}
    sources: dict[tuple[str, str], str] = {}
    for snapshot in snapshots:
        if snapshot.commit is None:
            continue
        blobs = read_blobs(repo_location(settings, entries[snapshot.repo]), [f.blob for f in snapshot.files])
        sources.update({(snapshot.repo, f.path): blobs[f.blob].decode("utf-8") for f in snapshot.files})
    generated = read_results(store, "generated_tests", day, GeneratedTestRow)
    candidates = candidates_of_day(
        read_results(store, "repo_analysis", day, AnalysisRow),
        generated,
        read_results(store, "refactor_proposals", day, RefactorRow),
        {s.repo: set(s.changed) for s in snapshots},
        sources,
    )
    candidates += docs_candidates(read_results(store, "generated_docs", day, GeneratedDocRow), sources)
    dataset_config = settings.pipeline.dataset
    first = not [d for d in dataset_window.available_days(store.root) if d < date.fromisoformat(day)]
    held_out_day, splits = held_out_of_day(context, settings, snapshots, tests_by_symbol(generated), first)
    for repo, split in sorted(splits.items()):
        for symbol in split.taught:
            with about(f"{repo}: {symbol.id} (lines {symbol.start_line}-{symbol.end_line})"):
                candidates.append(body_candidate(repo, symbol))
    candidates = [_routed(c, splits.get(c.repo)) for c in candidates]
    shaped = shape(
        candidates,
        dataset_config.system_prompt,
        load_token_counter(base_model_dir(settings)) if candidates else _no_tokens,
        settings.training.max_seq_len,
        dataset_config.near_duplicate_threshold,
    )
    target = store.folder("lora_dataset", day)
    with store.atomic_folder(target) as staging:
        save_dataset(shaped, staging)
    content_hash = sha256_tree(target)
    write_partition(
        store,
        "lora_dataset_report",
        day,
        {
            "report.json": {"counts": shaped.counts(), "dropped": [d.model_dump() for d in shaped.dropped]},
            HELD_OUT_FILE: held_out_day.model_dump(mode="json"),
        },
    )

    window = dataset_window.window_dirs(
        store.root, date.fromisoformat(day), settings.training.replay_window_days
    )
    window_train = dataset_window.load_split(window, "train") if window else []
    window_eval = dataset_window.load_split(window, "eval") if window else []
    counts = shaped.counts()
    return MaterializeResult(
        metadata={
            **counts,
            **DatasetFigures(
                candidates=len(candidates),
                train_rows=counts["train_rows"],
                eval_rows=counts["eval_rows"],
                row_count=counts["train_rows"] + counts["eval_rows"],
            ).metadata(),
            "max_seq_len": settings.training.max_seq_len,
            "dropped": md_table(
                ["task", "repo", "path", "reason", "detail"],
                [(d.task, d.repo, d.path, d.reason, d.detail) for d in shaped.dropped],
            ),
            "window_days": MetadataValue.json([p.name for p in window]),
            "window_train_rows": len(window_train),
            "window_eval_rows": len(window_eval),
            "window_fingerprint": dataset_window.fingerprint(window) if window else "",
            "held_out_percent": dataset_config.held_out_percent,
            "held_out_symbols": sum(len(v.held) for v in splits.values()),
            "held_out_tasks": len(held_out_day.functions),
            "skipped_symbols": sum(len(v.skipped) for v in splits.values()),
            "skipped": MetadataValue.json(skipped_of(splits)),
            "held_out_problems": MetadataValue.json(
                {repo: split.problem for repo, split in splits.items() if split.problem is not None}
            ),
            "path": MetadataValue.path(str(target)),
            "artifact_hash": content_hash,
        }
    )

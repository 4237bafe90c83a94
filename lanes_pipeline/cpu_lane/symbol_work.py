"""A repository's symbols at a commit, and the day's symbols to work on.

`symbols_at` reads the chosen Python files at a commit (git objects, no checkout) and scans them symbol by
symbol (symbols.py): files that do not parse are left out with their reason, and so is a symbol the
pipeline cannot handle (`skipped`, holdout.symbol_problem), so the day goes on without it; the repository's
own test files are read beside them, for references (the backlog's order) and for the example a prompt
shows. `day_work` compares today's symbols with the previous day's and picks the changed ones first, then
the backlog (backlog.py).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.cpu_lane.backlog import DayWork, choose_work
from lanes_pipeline.cpu_lane.holdout import symbol_problem
from lanes_pipeline.cpu_lane.repos import is_test_path
from lanes_pipeline.cpu_lane.symbols import Symbol, all_symbols, diff_scans, reference_counts, scan_repo
from lanes_pipeline.git import ls_tree, read_blobs


class SymbolsAt(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    commit: str
    symbols: list[Symbol] = Field([], description="of the chosen (non-test) files, by path then line")
    left_out: dict[str, str] = Field({}, description="path -> why the file was not scanned")
    test_sources: dict[str, str] = Field({}, description="the repository's own test files, path -> source")
    references: dict[str, int] = Field({}, description="symbol id -> references anywhere, tests included")
    skipped: dict[str, str] = Field(
        {}, description="symbol id -> why the pipeline cannot handle it (symbol_problem): not in `symbols`"
    )

    def by_id(self) -> dict[str, Symbol]:
        return {s.id: s for s in self.symbols}


def symbols_at(repo: Path, commit: str, paths: Collection[str] | None = None) -> SymbolsAt:
    """The symbols of `paths` (default: every non-test `.py` file) at `commit`, and its test files."""
    entries = [e for e in ls_tree(repo, commit) if e.path.endswith(".py")]
    chosen = [e for e in entries if (e.path in paths if paths is not None else not is_test_path(e.path))]
    tests = [e for e in entries if is_test_path(e.path)]
    blobs = read_blobs(repo, [e.blob for e in [*chosen, *tests]])
    sources, left_out = {}, {}
    for entry in chosen:
        try:
            sources[entry.path] = blobs[entry.blob].decode("utf-8")
        except UnicodeDecodeError as exc:
            left_out[entry.path] = f"not UTF-8: {exc.reason} at byte {exc.start}"
    test_sources = {}
    for entry in tests:
        try:
            test_sources[entry.path] = blobs[entry.blob].decode("utf-8")
        except UnicodeDecodeError:
            continue  # a test file we cannot read is no example and no reference: nothing lost
    scans = scan_repo(sources)
    left_out |= {scan.path: scan.error for scan in scans if scan.error is not None}
    scanned = all_symbols(scans)
    skipped = {s.id: problem for s in scanned if (problem := symbol_problem(s)) is not None}
    symbols = [s for s in scanned if s.id not in skipped]
    references = reference_counts({**sources, **test_sources}, symbols)
    return SymbolsAt(
        commit=commit,
        symbols=symbols,
        left_out=left_out,
        test_sources=test_sources,
        references=references,
        skipped=skipped,
    )


def day_work(
    today: SymbolsAt, before: Sequence[Symbol], covered: Collection[str], backlog_per_day: int
) -> tuple[DayWork, list[Symbol]]:
    """Today's work: symbols new or changed since `before` (the previous day's symbols; empty on a first
    day, when every symbol is new and the budget still applies through the backlog) and not covered in
    this form, then never-covered ones up to `backlog_per_day`; with the symbols in that order."""
    if before:
        diff = diff_scans(before, today.symbols)
        changed = {*diff.new, *diff.changed}
    else:
        changed = set()  # a first day: nothing "changed", the backlog (most referenced first) takes it
    work = choose_work(today.symbols, covered, changed, backlog_per_day, today.references)
    by_id = today.by_id()
    return work, [by_id[i] for i in work.ids]

"""The day's work on one repository: its new and changed symbols first, then a slice of the coverage backlog.

Taking only changed code leaves everything that already existed uncovered forever, and gives a fresh
install nothing to do on its first day. So each day also takes up to `backlog_per_day` symbols that were
never covered, most referenced first (the code the rest of the repository leans on), in an order that does
not change between runs: a repository of N symbols is covered in ceil(N / budget) days.

"Covered" is a set of strings holding memo keys and/or symbol ids (`path::name`): a symbol counts as covered
when either is in it. `day_work` compares today's symbols with the previous day's. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.repos.scan import SymbolsAt
from lanes_pipeline.repos.symbols import Symbol, diff_scans


class DayWork(Frozen):
    """Symbol ids chosen for the day, in the order they should be asked."""

    changed: list[str] = Field([], description="new or edited today, not yet covered in this form")
    backlog: list[str] = Field([], description="never covered, most referenced first")
    remaining: int = Field(0, description="never-covered symbols still waiting after today")

    @property
    def ids(self) -> list[str]:
        return [*self.changed, *self.backlog]


class RepoCoverage(Frozen):
    """How much of a repository's code the CPU lane has covered, for the assets' metadata and the summary."""

    repo: str
    symbols: int
    analysed: int
    with_accepted_test: int
    with_accepted_proposal: int

    def share(self, field: str) -> float:
        """A count as a fraction of all symbols (0.0 for a repository without symbols)."""
        count = getattr(self, field)
        return round(count / self.symbols, 4) if self.symbols else 0.0


def is_covered(symbol: Symbol, covered: Collection[str]) -> bool:
    return symbol.memo_key in covered or symbol.id in covered


def _source_order(symbol: Symbol) -> tuple[str, int, str]:
    return symbol.path, symbol.start_line, symbol.name


def choose_work(
    symbols: Sequence[Symbol],
    covered: Collection[str],
    changed: Collection[str],
    backlog_per_day: int,
    references: Mapping[str, int] | None = None,
) -> DayWork:
    """The day's symbols: `changed` (ids of today's new and edited symbols) whose memo key is not covered
    yet, in source order; then up to `backlog_per_day` symbols never covered under either key, most
    referenced first (`references`: id -> count), ties by path, line and name."""
    if backlog_per_day < 0:
        raise ValueError(f"backlog_per_day must be >= 0, got {backlog_per_day}")
    references = references or {}
    by_source = sorted(symbols, key=_source_order)
    today = [s for s in by_source if s.id in changed and s.memo_key not in covered]
    picked = {s.id for s in today}
    waiting = [s for s in by_source if s.id not in picked and not is_covered(s, covered)]
    waiting.sort(key=lambda s: (-references.get(s.id, 0), *_source_order(s)))
    backlog = waiting[:backlog_per_day]
    return DayWork(
        changed=[s.id for s in today],
        backlog=[s.id for s in backlog],
        remaining=len(waiting) - len(backlog),
    )


def coverage(
    repo: str,
    symbols: Sequence[Symbol],
    analysed: Collection[str],
    tested: Collection[str],
    proposed: Collection[str],
) -> RepoCoverage:
    """Coverage of today's symbols; each collection holds memo keys and/or ids of symbols that have an
    accepted analysis, an accepted generated test, an accepted refactor proposal."""
    return RepoCoverage(
        repo=repo,
        symbols=len(symbols),
        analysed=sum(is_covered(s, analysed) for s in symbols),
        with_accepted_test=sum(is_covered(s, tested) for s in symbols),
        with_accepted_proposal=sum(is_covered(s, proposed) for s in symbols),
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

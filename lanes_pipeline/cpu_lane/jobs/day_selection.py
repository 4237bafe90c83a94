"""The day's symbols of a repository, chosen once by the `day_symbols` asset and read by every CPU-lane job.

New and changed symbols since the previous day's commit come first, then up to `backlog_per_day` never
covered ones (backlog.py). The choice is remembered per (repository, day, commit, budget), so a re-run or a
backfill of a day takes the same symbols whatever other days covered since.
"""

from __future__ import annotations

from pathlib import Path

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.jobs.backlog import DayWork, day_work
from lanes_pipeline.cpu_lane.jobs.memo import Memo, memo_key
from lanes_pipeline.daily.artifacts import read_partition
from lanes_pipeline.repos.scan import SymbolsAt, symbols_at
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.repos.symbols import Symbol
from lanes_pipeline.store import ArtifactStore

DAY_SYMBOLS, SELECTION_FILE = "day_symbols", "symbols.json"
# Bump when the selection or generated_tests' job changes in a way that should forget remembered results.
DAY_VERSION = 1


def register_of(register: Memo, repo: str) -> tuple[str, set[str], set[str]]:
    """(the register's key, memo keys of symbols covered so far, ids of symbols with an accepted test)."""
    key = memo_key("tests_register", DAY_VERSION, repo)
    value = register.get(key) or {"covered": [], "accepted": []}
    return key, set(value["covered"]), set(value["accepted"])


class DaySelection(Frozen):
    """A repository's symbols at the day's commit (`today`) and the ones chosen for the day."""

    today: SymbolsAt
    chosen: DayWork

    def targets(self) -> list[Symbol]:
        by_id = self.today.by_id()
        return [by_id[i] for i in self.chosen.ids if i in by_id]


def code_symbols_at(snapshot: Snapshot, repo: Path) -> SymbolsAt:
    """The symbols of the snapshot's Python files that are not tests."""
    if snapshot.commit is None:
        raise ValueError(f"{snapshot.repo} has no commit on {snapshot.day}: no symbols to select")
    paths = snapshot.code_paths()
    return symbols_at(repo, snapshot.commit, paths)


def select_day(register: Memo, snapshot: Snapshot, repo: Path, backlog_per_day: int) -> DaySelection:
    """The day's symbols, chosen against generated_tests' register of covered symbols and remembered in
    it, so the choice does not move once the day's tests have grown the register."""
    today = code_symbols_at(snapshot, repo)
    selection_key = memo_key(
        "tests_selection",
        DAY_VERSION,
        snapshot.repo,
        snapshot.day.isoformat(),
        snapshot.commit,
        backlog_per_day,
    )
    chosen = register.get(selection_key)
    if chosen is None:
        _, covered, _ = register_of(register, snapshot.repo)
        before = symbols_at(repo, snapshot.previous_commit).symbols if snapshot.previous_commit else []
        work, _ = day_work(today, before, covered, backlog_per_day)
        chosen = work.model_dump()
        register.put(selection_key, chosen)
    return DaySelection(today=today, chosen=DayWork.model_validate(chosen))


def load_day_selection(store: ArtifactStore, day: str, snapshot: Snapshot, repo: Path) -> DaySelection:
    """day_symbols' choice for the snapshot's repository, with its symbols at the day's commit."""
    shape, what = dict[str, DayWork], "the day's chosen symbols"
    chosen = read_partition(store, DAY_SYMBOLS, day, SELECTION_FILE, shape, what)
    if snapshot.repo not in chosen:
        where = store.folder(DAY_SYMBOLS, day) / SELECTION_FILE
        raise KeyError(f"{where}: no symbols chosen for {snapshot.repo} (materialize {DAY_SYMBOLS} again)")
    return DaySelection(today=code_symbols_at(snapshot, repo), chosen=chosen[snapshot.repo])

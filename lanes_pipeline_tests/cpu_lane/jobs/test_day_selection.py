"""The day's symbols (day_selection.py): chosen once per repository, day and commit, so the choice holds
while the register of covered symbols grows; read back from the day_symbols partition, which names what
it lacks."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.jobs.day_selection import (
    DAY_SYMBOLS,
    SELECTION_FILE,
    load_day_selection,
    register_of,
    select_day,
)
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.daily.artifacts import write_partition
from lanes_pipeline.git import build_history
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.cpu_lane.fixtures import sample_snapshot


def test_the_days_choice_holds_while_the_register_grows_and_reads_back(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commits = [build_history(repo, [spec]) for spec in sample_repo.history(sample_repo.FIRST_MODULES)]
    day1 = sample_snapshot(repo, commits[0], None, 1)
    store = ArtifactStore(tmp_path / "artifacts")
    register = Memo(store, "tests_register")
    first = select_day(register, day1, repo, 2)
    assert [s.name for s in first.targets()] == ["words", "word_count"] and first.chosen.remaining == 1
    # generated_tests covers the day's symbols: a choice made again would take the rest of the backlog.
    key, covered, _ = register_of(register, day1.repo)
    register.put(key, {"covered": sorted(covered | {s.memo_key for s in first.targets()}), "accepted": []})
    assert select_day(register, day1, repo, 2) == first
    later = day1.model_copy(update={"day": date(2026, 11, 9)})  # the same commit, a day not chosen yet
    assert [s.name for s in select_day(register, later, repo, 2).targets()] == ["top_words"]

    write_partition(store, DAY_SYMBOLS, "2026-11-01", {SELECTION_FILE: {"sample": first.chosen.model_dump()}})
    assert load_day_selection(store, "2026-11-01", day1, repo) == first
    other = day1.model_copy(update={"repo": "other"})
    with pytest.raises(KeyError, match=r"symbols\.json: no symbols chosen for other"):
        load_day_selection(store, "2026-11-01", other, repo)
    with pytest.raises(FileNotFoundError, match=r"day_symbols has no partition 2026-11-02"):
        load_day_selection(store, "2026-11-02", day1, repo)

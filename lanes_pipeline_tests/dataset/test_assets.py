"""What the dataset's assets read, and the first-day rule: each reader names the partition it lacks or the
file that does not fit; a day counts as split before only once held_out_tasks wrote it whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanes_pipeline.daily.artifacts import write_partition
from lanes_pipeline.dataset.assets import load_accepted_work, taught_before
from lanes_pipeline.dataset.held_out_tasks import (
    HELD_OUT_FILE,
    HELD_OUT_TASKS,
    SPLITS_FILE,
    HeldOutDay,
    RepoHoldOut,
    load_splits,
)
from lanes_pipeline.dataset.writer import ACCEPTED_FILE, ACCEPTED_WORK, AcceptedWork, Candidate
from lanes_pipeline.store import ArtifactStore


def _split(store: ArtifactStore, day: str) -> None:
    files = {
        HELD_OUT_FILE: HeldOutDay(held_out_percent=50).model_dump(mode="json"),
        SPLITS_FILE: {"r": RepoHoldOut(unmaskable=["a.py"]).model_dump(mode="json")},
    }
    write_partition(store, HELD_OUT_TASKS, day, files)


def test_a_day_was_split_before_only_once_an_earlier_day_was_written_whole(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    assert not taught_before(store, "2026-11-02")
    _split(store, "2026-11-02")
    assert not taught_before(store, "2026-11-02")  # the day itself is not before it
    (store.root / HELD_OUT_TASKS / ".2026-11-01.k3j2").mkdir()  # an unfinished write's staging folder
    (store.root / HELD_OUT_TASKS / "2026-11-01").mkdir()  # a folder without its file
    assert not taught_before(store, "2026-11-02")
    _split(store, "2026-11-01")
    assert taught_before(store, "2026-11-02") and not taught_before(store, "2026-11-01")


def test_the_splits_and_the_accepted_work_read_back_as_written(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    _split(store, "2026-11-01")
    assert load_splits(store, "2026-11-01") == {"r": RepoHoldOut(unmaskable=["a.py"])}
    work = AcceptedWork(
        candidates=[Candidate(task="explain", repo="r", path="a.py", code="x = 1\n", answer="Sets x.")],
        tests={"r": {"f": ["from a import f\n\n\ndef test_f():\n    assert f(2) == 4\n"]}},
    )
    write_partition(store, ACCEPTED_WORK, "2026-11-01", {ACCEPTED_FILE: work.model_dump(mode="json")})
    assert load_accepted_work(store, "2026-11-01") == work


def test_a_missing_or_wrong_partition_is_named(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"accepted_work has no partition 2026-11-03 .*materialize"):
        load_accepted_work(store, "2026-11-03")
    with pytest.raises(FileNotFoundError, match=r"held_out_tasks has no partition 2026-11-03"):
        load_splits(store, "2026-11-03")
    write_partition(store, ACCEPTED_WORK, "2026-11-03", {ACCEPTED_FILE: {"candidates": "nope"}})
    with pytest.raises(ValueError, match=r"2026-11-03/accepted\.json: not the CPU lane's accepted work"):
        load_accepted_work(store, "2026-11-03")
    write_partition(store, HELD_OUT_TASKS, "2026-11-03", {SPLITS_FILE: {"r": {"held": "nope"}}})
    with pytest.raises(ValueError, match=r"2026-11-03/splits\.json: not the day's held-out splits"):
        load_splits(store, "2026-11-03")

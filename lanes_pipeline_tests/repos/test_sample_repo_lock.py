"""What the fault drills' concurrent runs found, fixed: two runs that start at once on a fresh data folder
each built the sample repository and replaced the other's while that run read it (`git ls-tree` answered
BAD for a blob). The check and the build now hold a lock file beside the repository."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

from lanes_pipeline.repos import sample_repo
from lanes_pipeline.repos.sample_repo import ensure_sample_repo, is_current


def test_a_run_waits_for_the_build_in_progress(tmp_path: Path) -> None:
    target = tmp_path / "sample_repo"
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (ensure_sample_repo(target), done.set()))
    with (tmp_path / ".sample_repo.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another run is building it
        waiter.start()
        assert not done.wait(1.0) and not target.exists()
    waiter.join(timeout=120)
    assert done.is_set() and is_current(target)


def test_runs_that_start_at_once_build_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "sample_repo"
    builds: list[Path] = []
    build = sample_repo.build_history

    def counted(repo: Path, specs: list[sample_repo.CommitSpec]) -> str:
        builds.append(repo)
        return build(repo, specs)

    monkeypatch.setattr(sample_repo, "build_history", counted)
    start = threading.Barrier(2)
    results: list[Path] = []

    def run() -> None:
        start.wait()
        results.append(ensure_sample_repo(target))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == [target, target] and len(builds) == 1 and is_current(target)

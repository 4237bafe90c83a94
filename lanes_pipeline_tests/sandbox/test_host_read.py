"""Reading a sandbox's result on the host (sandbox/host_read.py): a link anywhere on the path, a FIFO, a
file over the limit are refused without reading them; an absent file is None; a plain file is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lanes_pipeline.sandbox.host_read import UnsafeResultError, read_result, remove_result


@pytest.fixture
def worktree(tmp_path: Path) -> Path:
    (tmp_path / "tree" / ".lanes").mkdir(parents=True)
    (tmp_path / "host.txt").write_text("HOST-CANARY")
    return tmp_path / "tree"


def test_a_plain_result_is_read_and_an_absent_one_is_none(worktree: Path) -> None:
    (worktree / ".lanes" / "report-0.json").write_text("{}")
    assert read_result(worktree, ".lanes/report-0.json") == b"{}"
    assert read_result(worktree, ".lanes/report-1.json") is None
    assert read_result(worktree, "missing/report.json") is None


def test_a_link_as_the_file_or_as_a_folder_on_its_path_is_refused(worktree: Path) -> None:
    (worktree / ".lanes" / "report-0.json").symlink_to(worktree.parent / "host.txt")
    with pytest.raises(UnsafeResultError, match="symbolic link") as refused:
        read_result(worktree, ".lanes/report-0.json")
    assert "HOST-CANARY" not in str(refused.value)
    os.rename(worktree / ".lanes", worktree / "old")
    (worktree / ".lanes").symlink_to(worktree.parent)
    with pytest.raises(UnsafeResultError, match="link or not a folder"):
        read_result(worktree, ".lanes/host.txt")
    with pytest.raises(UnsafeResultError, match="link or not a folder"):
        remove_result(worktree, ".lanes/host.txt")
    assert (worktree.parent / "host.txt").exists()  # the host's file is never removed through the link


def test_a_fifo_and_a_file_over_the_limit_are_refused_without_blocking(worktree: Path) -> None:
    os.mkfifo(worktree / ".lanes" / "report-0.json")
    with pytest.raises(UnsafeResultError, match="not a regular file"):
        read_result(worktree, ".lanes/report-0.json")
    (worktree / ".lanes" / "big.json").write_bytes(b"x" * 100)
    with pytest.raises(UnsafeResultError, match="more than 10"):
        read_result(worktree, ".lanes/big.json", max_bytes=10)
    with pytest.raises(UnsafeResultError, match="not a path inside"):
        read_result(worktree, "../host.txt")


def test_removing_a_link_removes_the_link_not_its_target(worktree: Path) -> None:
    link = worktree / ".lanes" / "report-0.json"
    link.symlink_to(worktree.parent / "host.txt")
    remove_result(worktree, ".lanes/report-0.json")
    assert not link.is_symlink() and (worktree.parent / "host.txt").read_text() == "HOST-CANARY"

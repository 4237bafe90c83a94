"""bench drills' pure parts: the kill drill's counting, the half-adapter and registry checks, the cache and
memo checks, the disk-full judgement, the targets and the report. The drills themselves (real servers,
real kills) are the benchmark, `python -m lanes_pipeline.bench drills`, not the suite."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import struct
import unittest.mock
from datetime import date
from pathlib import Path

import pytest

from lanes_pipeline.bench.drills import Send, guarded, half_adapter_reason, kill_counts, markdown, targets
from lanes_pipeline.bench.drills_cpu import SendLog, cache_check, kill_requests, memo_check
from lanes_pipeline.bench.drills_disk import clear_error, shaped, write_day
from lanes_pipeline.bench.drills_gpu import half_adapters, registry_state
from lanes_pipeline.cpu_lane.batching.answer_cache import CacheEntry, ResponseCache
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.http import ChatMessage, ChatRequest
from lanes_pipeline.store import ArtifactStore

ITEMS = ["a", "b", "c", "d"]


def test_kill_counts_lost_re_asked_and_in_flight_apart() -> None:
    sends = [
        Send(item="a", run=0, committed_before=False, answered=True),
        Send(item="b", run=0, committed_before=False, in_flight_at_kill=True),
        Send(item="b", run=1, committed_before=False, answered=True),  # asked again: expected
        Send(item="a", run=1, committed_before=True, answered=True),  # committed, asked again: counted
        Send(item="c", run=1, committed_before=False, answered=True),
    ]
    committed = [{"a": "A"}, {"a": "A", "b": "B", "c": "C"}]
    counts = kill_counts(ITEMS, sends, committed, {"a": "A", "b": "B", "c": "C2"}, kills=1)
    assert counts.re_asked == 1 and counts.re_asked_items == ["a"]
    assert counts.in_flight_at_kill == 1 and counts.in_flight_asked_again == 1
    assert counts.lost == 1 and counts.lost_items == ["c"]  # changed after it was committed
    assert counts.unanswered_at_end == 1 and counts.committed_before_last_kill == 1
    clean = kill_counts(ITEMS, sends[:3] + sends[4:], committed, committed[-1], kills=1)
    assert (clean.lost, clean.re_asked) == (0, 0)
    gone = kill_counts(ITEMS, [], committed, {"b": "B"}, kills=1)
    assert gone.lost_items == ["a", "c"]


def test_the_kill_batch_is_fifty_distinct_questions_behind_one_prefix() -> None:
    requests = kill_requests()
    assert len(requests) == 50 and len({r.messages[-1].content for r in requests}) == 50
    assert len({r.messages[0].content for r in requests}) == 1


def _chat(text: str) -> ChatRequest:
    return ChatRequest(model="m", messages=[ChatMessage(role="user", content=text)], max_tokens=4)


def test_the_send_log_reads_the_cache_at_send_time_and_marks_the_open_requests(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    log = SendLog(path, {"one": ("q1", "k1"), "two": ("q2", "k2")})
    first = log.begin(_chat("one"))  # no cache file yet: nothing committed
    with ResponseCache(path) as cache:
        cache.put(CacheEntry(key="k1", fingerprint="f", item_id="q1", text="x", metrics={}))
    log.end(first, answered=True)
    again, other = log.begin(_chat("one")), log.begin(_chat("two"))
    assert log.mark_killed() == 2
    log.end(again, answered=False)
    assert [(s.item, s.committed_before, s.in_flight_at_kill) for s in log.sends] == [
        ("q1", False, False),
        ("q1", True, True),
        ("q2", False, True),
    ]
    assert log.sends[other].answered is False and log.sends[first].answered is True
    try:
        log.begin(_chat("three"))
    except KeyError as exc:
        assert "no item of the batch" in str(exc)
    else:
        raise AssertionError("a request for no item must be named")


def _safetensors(path: Path, header: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def _adapter(folder: Path, weights: bool = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
    if weights:
        _safetensors(folder / "adapter_model.safetensors", b'{"a.lora_A.weight": {"shape": [1]}}')
    return folder


def test_half_adapters_are_visible_folders_without_a_complete_adapter(tmp_path: Path) -> None:
    _adapter(tmp_path / "whole")
    _adapter(tmp_path / "no-weights", weights=False)
    torn = _adapter(tmp_path / "torn", weights=False)
    (torn / "adapter_model.safetensors").write_bytes(struct.pack("<Q", 999) + b"{")  # cut short
    (tmp_path / "empty").mkdir()
    _adapter(tmp_path / ".lanes-x.partial-1", weights=False)  # hidden staging: no loader sees it
    assert half_adapters(tmp_path) == [
        "empty: missing or unreadable: adapter_config.json, adapter_model.safetensors",
        "no-weights: missing or unreadable: adapter_model.safetensors",
        "torn: missing or unreadable: adapter_model.safetensors",
    ]
    assert (
        half_adapter_reason({"x"}, True, True) is None and half_adapter_reason(set(), True, True) == "empty"
    )


def test_registry_state_checks_folders_alias_and_what_vllm_serves_apart(tmp_path: Path) -> None:
    registry = AdapterRegistry(tmp_path / "registry.sqlite")
    one, two = _adapter(tmp_path / "v1"), _adapter(tmp_path / "v2")
    for name, path in (("v1", one), ("v2", two)):
        registry.add(name, date(2026, 11, 1), path, name, {})
    assert registry_state(registry, "cur")["consistent"]  # nothing promoted, no alias: consistent
    registry.set_status("v1", "promoted")
    registry.record_alias("cur", "v1", "drill")
    assert registry_state(registry, "cur", str(one)) == {
        "consistent": True,
        "problems": [],
        "alias_target": "v1",
        "served_matches_registry": True,
        "serving_problem": None,
    }
    moved = registry_state(registry, "cur", str(two))  # vLLM moved, the registry not told
    assert moved["consistent"] and moved["served_matches_registry"] is False
    assert moved["serving_problem"] == f"vLLM serves cur from {two}, the registry says {one}"
    assert registry_state(registry, "cur", None)["served_matches_registry"] is False  # not served at all
    registry.set_status("v2", "promoted")  # marked promoted, the alias move never recorded
    stray = registry_state(registry, "cur", str(one))
    assert stray["problems"] == ["promoted but never the alias target: v2"] and not stray["consistent"]
    (two / "adapter_model.safetensors").unlink()
    assert "version folder not a complete adapter: v2" in registry_state(registry, "cur")["problems"]


def test_cache_and_memo_checks_count_unreadable_entries(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite3"
    with ResponseCache(path) as cache:
        cache.put(CacheEntry(key="k", fingerprint="f", item_id="i", text="t", metrics={}))
    assert cache_check(path) == {"cache_integrity": "ok", "cache_entries": 1, "cache_unreadable": 0}
    db = sqlite3.connect(path)
    db.execute("INSERT INTO responses VALUES ('bad', 'f', 0, '{not json')")
    db.commit()
    db.close()
    assert cache_check(path)["cache_unreadable"] == 1
    memo = tmp_path / "artifacts" / "_memo" / "ns" / "ab"
    memo.mkdir(parents=True)
    (memo / "ab1.json").write_text("{}")
    (memo / "ab2.json").write_text("{torn")
    (memo / ".ab3.json.tmp").write_text("")
    assert memo_check(tmp_path / "artifacts") == {
        "memo_entries": 2,
        "memo_unreadable": 1,
        "memo_temp_left": 1,
    }


def test_the_disk_drill_writes_a_day_as_lora_dataset_does_and_judges_the_error(tmp_path: Path) -> None:
    data = shaped(3, 50, "2026-11-01")
    assert len(data.train) == 2 and len(data.eval) == 1 and len(data.train[0].messages[1]["content"]) == 50
    assert write_day(tmp_path, "2026-11-01", 3, 50) == {"ok": True}
    assert (tmp_path / "lora_dataset" / "2026-11-01" / "dataset_dict.json").is_file()
    where = Path("/x/lora_dataset/2026-11-02")
    assert clear_error(f"OSError: [Errno 28] No space left on device while writing {where}; ...", where)
    assert clear_error(f"OSError: [Errno 27] File too large while writing {where}", where)
    assert not clear_error("OSError: [Errno 28] No space left on device", where)  # where?
    assert not clear_error(f"RuntimeError: something broke at {where}", where)


def test_a_full_disk_names_the_artifact_and_keeps_the_previous_one(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    target = store.folder("lora_dataset", "2026-11-02")
    with store.atomic_folder(target) as staging:
        (staging / "data").write_text("old")
    for code in (errno.ENOSPC, errno.EFBIG):
        with pytest.raises(OSError) as error, store.atomic_folder(target) as staging:
            (staging / "data").write_text("new, half")
            raise OSError(code, os.strerror(code))
        assert error.value.errno == code and f"while writing {target}" in str(error.value)
        assert "previous version, if any, is kept" in str(error.value)
    assert (target / "data").read_text() == "old" and sorted(p.name for p in target.parent.iterdir()) == [
        "2026-11-02"
    ]
    full = OSError(errno.ENOSPC, "No space left on device")
    with (
        pytest.raises(OSError, match=r"while writing .*memo\.json"),
        unittest.mock.patch("os.fsync", side_effect=full),
    ):
        store.write_bytes(tmp_path / "memo.json", b"{}")
    assert not list(tmp_path.glob(".memo.json.*"))
    with pytest.raises(OSError, match=r"^\[Errno 13\] denied$"), store.atomic_folder(target):
        raise OSError(errno.EACCES, "denied")  # other errors pass unchanged


def test_targets_and_the_report_are_honest_about_drills_that_did_not_run() -> None:
    drills = {
        "cpu_server_kills": {"done": "killed", "kills": 3, "lost": 0, "re_asked": 1},
        "training_kill": {"half_adapters": 0, "registry_consistent": True},
        "alias_move_kill": {"half_adapters": 0},
        "concurrent_runs": {"identical": True},
        "disk_full": {"error": "RuntimeError: no tmpfs"},
    }
    t = targets(drills)
    assert t["lost"] == {"value": 0, "target": 0, "met": True}
    assert t["re_asked"]["met"] is False and t["half_adapters"] == {"value": 0, "target": 0, "met": True}
    assert t["identical"]["met"] is True
    assert targets({})["lost"] == {"value": None, "target": 0, "met": False}
    assert targets({"training_kill": {"half_adapters": 0}})["half_adapters"]["value"] is None
    report = markdown({"drills": drills, "targets": t})
    assert "| cpu_server_kills | killed | kills 3, lost 0, re_asked 1" in report
    assert "| disk_full |  | FAILED: RuntimeError: no tmpfs |" in report
    assert "re_asked = 1 (target 0): MISSED" in report and "lost = 0 (target 0): met" in report


def test_a_drill_that_raises_is_its_own_row_and_the_next_one_runs() -> None:
    def broken() -> dict[str, object]:
        raise ValueError("no server")

    result = guarded("x", broken)
    assert result["error"] == "ValueError: no server" and "no server" in result["trace"]
    assert guarded("y", lambda: {"lost": 0}) == {"lost": 0}

"""What the fault drills (bench drills: alias_move_kill) found, fixed: a promotion run SIGKILLed after vLLM
moved the alias but before the registry recorded it left vLLM serving the new version under the alias while
the registry named the old one, and the restore (the adapters sensor) left it so; and a run killed between
marking a version promoted and recording the alias move left a promoted version the alias never pointed at;
and the adapters sensor, ticking between a promotion's move on vLLM and its record, moved the alias back for a
tick. Driven against the fake vLLM of test_remote_adapters (httpx's MockTransport)."""

from __future__ import annotations

import subprocess
import sys
from datetime import date
from pathlib import Path

import httpx
import pytest

from lanes_pipeline.errors import AliasMoveInProgressError
from lanes_pipeline.gpu_lane.adapters import UnknownVersionError
from lanes_pipeline_tests.gpu_lane.test_remote_adapters import _adapter, _service


def test_restore_moves_the_alias_back_where_the_registry_says(tmp_path: Path) -> None:
    service, fake = _service(tmp_path, None)
    one, two = _adapter(tmp_path / "lanes-2026-11-01"), _adapter(tmp_path / "lanes-2026-11-02")
    v1 = service.registry.add("lanes-2026-11-01", date(2026, 11, 1), one, "f1", {})
    service.registry.add("lanes-2026-11-02", date(2026, 11, 2), two, "f2", {})
    service.promote(v1, "first")
    assert service.restore() == []  # served from the registry's target: nothing to do

    service.client.move_alias("lanes-current", str(two))  # the killed run got this far, no further
    assert fake.loaded["lanes-current"] == str(two)
    assert service.restore()[0] == "lanes-current"
    assert fake.loaded["lanes-current"] == str(one)
    assert service.registry.alias_target("lanes-current").name == "lanes-2026-11-01"  # type: ignore[union-attr]
    assert service.restore() == []


def test_the_alias_move_and_its_statuses_are_one_transaction(tmp_path: Path) -> None:
    service, _ = _service(tmp_path, None)
    one, two = _adapter(tmp_path / "lanes-2026-11-01"), _adapter(tmp_path / "lanes-2026-11-02")
    v1 = service.registry.add("lanes-2026-11-01", date(2026, 11, 1), one, "f1", {})
    v2 = service.registry.add("lanes-2026-11-02", date(2026, 11, 2), two, "f2", {})
    service.promote(v1, "first")
    service.promote(v2, "second")
    report = service.rollback()
    registry = service.registry
    assert report.version == v1.name and registry.get(v2.name).status == "rolled_back"
    assert [m.version for m in registry.alias_history("lanes-current")] == [v1.name, v2.name, v1.name]
    with pytest.raises(UnknownVersionError, match="'missing'"):
        registry.record_move("lanes-current", v2.name, "bad", {v2.name: "promoted", "missing": "rejected"})
    # Neither the status nor the move of the failed call was kept.
    assert registry.get(v2.name).status == "rolled_back"
    assert len(registry.alias_history("lanes-current")) == 3


def test_a_restore_during_a_promotion_stands_aside(tmp_path: Path) -> None:
    """The sensor's restore (`wait_for_move=False`) while a promotion is between vLLM's move and the
    registry's record: it raises AliasMoveInProgressError and leaves the alias where the promotion put it."""
    service, fake = _service(tmp_path, None)
    one, two = _adapter(tmp_path / "lanes-2026-11-01"), _adapter(tmp_path / "lanes-2026-11-02")
    v1 = service.registry.add("lanes-2026-11-01", date(2026, 11, 1), one, "f1", {})
    v2 = service.registry.add("lanes-2026-11-02", date(2026, 11, 2), two, "f2", {})
    service.promote(v1, "first")
    seen: list[str] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        # The smoke request to the alias comes after the move and before the record: the sensor ticks now.
        if request.url.path == "/v1/chat/completions" and b'"lanes-current"' in request.content:
            try:
                seen.append(f"restored {service.restore(wait_for_move=False)}")
            except AliasMoveInProgressError as exc:
                seen.append(str(exc))
        return fake(request)

    service.client.http = httpx.Client(base_url=service.client.base_url, transport=httpx.MockTransport(vllm))
    service.promote(v2, "second")
    assert len(seen) == 1 and "alias move is in progress" in seen[0], seen
    assert fake.loaded["lanes-current"] == str(two)
    assert service.registry.alias_target("lanes-current").name == v2.name  # type: ignore[union-attr]
    assert service.restore(wait_for_move=False) == []


def test_a_move_killed_while_holding_the_lock_is_corrected_by_the_next_restore(tmp_path: Path) -> None:
    """The lock is the kernel's (flock): a run SIGKILLed inside an alias move releases it, so the next
    restore corrects what the dead move left; while the run lives, the restore stands aside."""
    service, fake = _service(tmp_path, None)
    one, two = _adapter(tmp_path / "lanes-2026-11-01"), _adapter(tmp_path / "lanes-2026-11-02")
    v1 = service.registry.add("lanes-2026-11-01", date(2026, 11, 1), one, "f1", {})
    service.registry.add("lanes-2026-11-02", date(2026, 11, 2), two, "f2", {})
    service.promote(v1, "first")
    lock = service.registry.path.with_name(service.registry.path.name + ".alias-move.lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        service.client.move_alias("lanes-current", str(two))  # the other run's move, not yet recorded
        with pytest.raises(AliasMoveInProgressError, match="in progress"):
            service.restore(wait_for_move=False)
        assert fake.loaded["lanes-current"] == str(two)
    finally:
        holder.kill()
        holder.wait()
    assert service.restore(wait_for_move=False)[0] == "lanes-current"
    assert fake.loaded["lanes-current"] == str(one)


HOLD_LOCK = """
import fcntl, sys, time
lock = open(sys.argv[1], "a")
fcntl.flock(lock, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""

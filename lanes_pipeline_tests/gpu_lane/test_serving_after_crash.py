"""What the fault drills (bench drills: alias_move_kill) found, fixed: a promotion run SIGKILLed after vLLM
moved the alias but before the registry recorded it left vLLM serving the new version under the alias while
the registry named the old one, and the restore (the adapters sensor) left it so; and a run killed between
marking a version promoted and recording the alias move left a promoted version the alias never pointed at.
Driven against the fake vLLM of test_remote_adapters (httpx's MockTransport)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

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

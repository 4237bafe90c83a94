"""bench/__main__.py: a benchmark's run replaces its own entry of data/bench/report.json and keeps the
others (benchmarks run one at a time, hours each on two cores)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from lanes_pipeline.bench import __main__ as bench_main


def test_a_run_replaces_its_own_results_and_keeps_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANES_DATA_DIR", str(tmp_path))
    report = tmp_path / "bench" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"results": {"learning": {"days": 3}, "cpu_yield": {"old": True}}}))
    stub = types.SimpleNamespace(run=lambda settings: {"dataset_rows": 41})
    monkeypatch.setattr(bench_main.importlib, "import_module", lambda name: stub)
    bench_main.main(["cpu_yield"])
    results = json.loads(report.read_text())["results"]
    assert results["learning"] == {"days": 3}
    assert results["cpu_yield"]["dataset_rows"] == 41 and "old" not in results["cpu_yield"]
    assert {"wall_s", "started", "config_dir"} <= results["cpu_yield"].keys()
    assert "cpu_yield" in (tmp_path / "bench" / "report.md").read_text()


def test_a_file_that_is_not_a_report_is_named_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text("not json")
    with pytest.raises(SystemExit, match=r"report\.json: not a benchmark report"):
        bench_main._existing(path)
    assert path.read_text() == "not json"
    assert bench_main._existing(tmp_path / "missing.json") == {}

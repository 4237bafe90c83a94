"""bench/__main__.py and bench/report.py: a benchmark's run replaces its own entry of data/bench/report.json
and keeps the others (benchmarks run one at a time, hours each on two cores); docs/benchmarks.md is written
from that report, one section per benchmark with its table, machine and date."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from lanes_pipeline.bench import __main__ as bench_main
from lanes_pipeline.bench.report import BenchReport, BenchReportError, read_report, report_markdown


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
    assert {"wall_s", "started", "machine", "config_dir"} <= results["cpu_yield"].keys()
    assert "cpu_yield" in (tmp_path / "bench" / "report.md").read_text()


def test_a_file_that_is_not_a_report_is_named_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text("not json")
    with pytest.raises(BenchReportError, match=r"report\.json: not a benchmark report"):
        read_report(path)
    assert path.read_text() == "not json"
    path.write_text(json.dumps({"results": ["cpu_yield"]}))
    with pytest.raises(
        BenchReportError,
        match=r"report\.json: not a benchmark report \(results: Input should be a valid dictionary",
    ):
        read_report(path)
    assert read_report(tmp_path / "missing.json") == BenchReport()


REPORT = {
    "started": "2026-12-03T10:00:00+00:00",
    "machine": "x86_64, 2 CPUs, 23 GiB",
    "results": {
        "trials": {
            "rows": [{"name": "ik-q4"}],
            "markdown": "| trial | tok/s |\n|---|---|\n| ik-q4 | 283 |",
            "started": "2026-12-03T10:01:00+00:00",
            "machine": "x86_64, 16 CPUs, 128 GiB",
            "wall_s": 71.2,
            "config_dir": "configs",
        },
        "cpu_servers": {
            "parse_rate": {"ik": 1.0},
            "n": 20,
            "note": "a | b",
            "started": "2026-12-02T09:00:00",
        },
    },
}


def test_the_docs_have_one_section_per_benchmark_with_its_table_machine_and_date() -> None:
    text = report_markdown(BenchReport.model_validate(REPORT), "data/bench/report.json")
    assert text.startswith("# Benchmarks\n")
    assert "`python -m lanes_pipeline.bench --docs` from `data/bench/report.json`" in text
    # sections in name order, each with its own run's date and machine (the report's when it has none)
    assert text.index("## cpu_servers") < text.index("## trials")
    assert "run 2026-12-03T10:01:00+00:00 on x86_64, 16 CPUs, 128 GiB, 71 s." in text
    assert "| ik-q4 | 283 |" in text
    assert "run 2026-12-02T09:00:00 on x86_64, 2 CPUs, 23 GiB." in text
    # a benchmark without a table of its own: its figures, one row each, bookkeeping left out
    assert '| `parse_rate` | {"ik": 1.0} |' in text and "| `n` | 20 |" in text
    assert "| `note` | a \\| b |" in text
    assert "`started`" not in text and "`markdown`" not in text


def test_bench_docs_writes_docs_benchmarks_md_from_the_report(tmp_path: Path) -> None:
    source = tmp_path / "data" / "bench" / "report.json"
    source.parent.mkdir(parents=True)
    source.write_text(json.dumps(REPORT))
    docs = bench_main.write_docs(source, tmp_path / "docs" / "benchmarks.md", root=tmp_path)
    expected = report_markdown(BenchReport.model_validate(REPORT), "data/bench/report.json")
    assert docs.read_text() == expected


def test_bench_docs_keeps_the_sections_of_benchmarks_the_report_has_no_run_of(tmp_path: Path) -> None:
    """A fresh clone has docs/benchmarks.md but no data/bench/report.json: a benchmark run there replaces
    its own section and leaves the others as they were."""
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir(parents=True)
    earlier = {"suite": {"tests": 600, "started": "2026-12-01T00:00:00"}} | REPORT["results"]
    docs.write_text(report_markdown(BenchReport.model_validate(REPORT | {"results": earlier}), "x"))
    source = tmp_path / "data" / "bench" / "report.json"
    source.parent.mkdir(parents=True)
    source.write_text(json.dumps({"results": {"trials": {"markdown": "| new table |"}}}))
    text = bench_main.write_docs(source, docs, root=tmp_path).read_text()
    assert "| new table |" in text and "| ik-q4 | 283 |" not in text  # the report's run replaced its own
    assert "| `tests` | 600 |" in text and "run 2026-12-01T00:00:00" in text  # kept word for word
    assert '| `parse_rate` | {"ik": 1.0} |' in text
    assert text.index("## cpu_servers") < text.index("## suite") < text.index("## trials")
    assert text.count("## ") == 3


def test_an_unknown_benchmark_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_main.main(["cpu_yeld"])
    assert "no benchmark named cpu_yeld; the benchmarks: cpu_lane" in capsys.readouterr().err

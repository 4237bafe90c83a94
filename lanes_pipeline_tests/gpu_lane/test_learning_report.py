"""The learning curve without a lane: points read back from the artifact store, the Markdown table, the
PNG chart, the day's summary line, the Plots-tab metadata and `lanes report` (output, files, empty and
corrupt data folders)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from click.testing import CliRunner

from lanes_pipeline.cli import main
from lanes_pipeline.daily.resources import ArtifactStoreResource
from lanes_pipeline.gpu_lane.learning_report import (
    LearningReportError,
    learning_line,
    load_points,
    markdown_table,
    plot_metadata,
    render_chart,
)
from lanes_pipeline.gpu_lane.promotion import Figures, LearningPoint
from lanes_pipeline.store import ArtifactStore

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def three_points() -> list[LearningPoint]:
    """Day 1: no adapter (quiet day); day 2: promoted, HumanEval unmeasured on the served side;
    day 3: candidate rejected, the day-2 adapter stays served, no eval loss."""
    return [
        LearningPoint(
            day=date(2026, 11, 1),
            served="base",
            base=Figures(eval_loss=1.5, repo_pass_rate=0.1, humaneval_pass1=0.025),
            served_figures=Figures(eval_loss=1.5, repo_pass_rate=0.1, humaneval_pass1=0.025),
            note="no adapter today: no training rows",
        ),
        LearningPoint(
            day=date(2026, 11, 2),
            served="lanes-2026-11-02",
            candidate="lanes-2026-11-02",
            promoted=True,
            base=Figures(eval_loss=1.5, repo_pass_rate=0.1, humaneval_pass1=0.025),
            served_figures=Figures(eval_loss=1.234, repo_pass_rate=0.15, humaneval_pass1=None),
            evaluation_s=754.4,
            requests=1210,
        ),
        LearningPoint(
            day=date(2026, 11, 3),
            served="lanes-2026-11-02",
            candidate="lanes-2026-11-03",
            promoted=False,
            base=Figures(eval_loss=None, repo_pass_rate=0.1, humaneval_pass1=0.025),
            served_figures=Figures(eval_loss=None, repo_pass_rate=0.2, humaneval_pass1=0.05),
            note="eval loss not judged (too few held-out rows)",
        ),
    ]


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own data folder, as `lanes` finds it (LANES_DATA_DIR)."""
    folder = tmp_path / "data"
    monkeypatch.setenv("LANES_DATA_DIR", str(folder))
    return folder


def store_points(points: list[LearningPoint]) -> ArtifactStore:
    """Written the way adapter_evaluation writes them: one learning.json per day partition."""
    store = ArtifactStoreResource().store()
    for point in points:
        store.write_json(
            "adapter_evaluation", point.day.isoformat(), "learning.json", point.model_dump(mode="json")
        )
    return store


def test_the_table_has_a_row_per_day_with_base_candidate_and_served_figures() -> None:
    lines = markdown_table(three_points()).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    figures = [
        "completion edit similarity",
        "repo_pass_rate",
        "anchor pass rate",
        "eval loss",
        "HumanEval pass@1",
    ]
    expected = ["day", "served", "candidate", "promoted", "primary p"]
    for figure in figures:
        expected += [f"{figure} base", f"{figure} candidate", f"{figure} served"]
    assert header == [*expected, "evaluation", "note"]
    assert len(lines) == 2 + 3
    rows = [
        dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]
    ]
    assert [r["day"] for r in rows] == ["2026-11-01", "2026-11-02", "2026-11-03"]
    first, second, third = rows
    assert (first["served"], first["candidate"], first["promoted"]) == ("base", "no adapter today", "no")
    assert (first["repo_pass_rate base"], first["repo_pass_rate served"], first["eval loss base"]) == (
        "10%",
        "10%",
        "1.50",
    )
    assert first["note"] == "no adapter today: no training rows"
    assert (first["evaluation"], second["evaluation"]) == ("-", "12 min 34 s, 1210 answers asked")
    assert (second["served"], second["promoted"], second["repo_pass_rate served"]) == (
        "lanes-2026-11-02",
        "yes",
        "15%",
    )
    assert (
        second["eval loss served"],
        second["HumanEval pass@1 base"],
        second["HumanEval pass@1 served"],
    ) == (
        "1.23",
        "2.5%",
        "-",
    )
    assert (third["candidate"], third["promoted"], third["eval loss base"]) == ("lanes-2026-11-03", "no", "-")
    assert third["note"] == "eval loss not judged (too few held-out rows)"


def test_the_days_line_and_the_plots_metadata() -> None:
    first, second, third = three_points()
    assert learning_line(second) == (
        "learning 2026-11-02: served lanes-2026-11-02 completion similarity - (base -), repo_pass_rate 15% "
        "(base 10%), anchor - (base -), eval loss 1.23 (base 1.50), HumanEval - (base 2.5%); evaluated in "
        "12 min 34 s, 1210 answers asked"
    )
    assert learning_line(first).endswith("; no adapter today: no training rows")
    assert "candidate lanes-2026-11-03 not promoted" in learning_line(third)
    assert plot_metadata(second) == {
        "base_repo_pass_rate": 0.1,
        "served_repo_pass_rate": 0.15,
        "base_eval_loss": 1.5,
        "served_eval_loss": 1.234,
        "base_humaneval_pass1": 0.025,
    }
    assert set(plot_metadata(third)) == {
        "base_repo_pass_rate",
        "served_repo_pass_rate",
        "base_humaneval_pass1",
        "served_humaneval_pass1",
    }
    assert all(isinstance(value, float) for value in plot_metadata(first).values())


def test_points_come_back_sorted_by_day(data: Path) -> None:
    points = three_points()
    store = store_points([points[2], points[0], points[1]])
    (store.folder("adapter_evaluation", "2026-11-04")).mkdir(parents=True)  # a day evaluated without a point
    assert load_points(store) == points
    assert load_points(ArtifactStore(data / "elsewhere")) == []


def test_the_chart_is_a_png(tmp_path: Path) -> None:
    path = render_chart(three_points(), tmp_path / "reports" / "learning.png")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    single = render_chart(three_points()[:1], tmp_path / "one.png")  # one day still draws
    assert single.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="no day has been evaluated"):
        render_chart([], tmp_path / "none.png")


def test_lanes_report_prints_the_table_and_writes_both_files(data: Path) -> None:
    store_points(three_points())
    result = CliRunner().invoke(main, ["report"])
    assert result.exit_code == 0, result.output
    markdown, chart = data / "reports" / "learning.md", data / "reports" / "learning.png"
    assert f"table: {markdown}" in result.output and f"chart: {chart}" in result.output
    assert markdown_table(three_points()) in result.output
    assert markdown_table(three_points()) in markdown.read_text()
    assert "![learning curve](learning.png)" in markdown.read_text()
    assert chart.read_bytes().startswith(PNG_MAGIC)


def test_lanes_report_on_an_empty_data_folder_says_what_to_run(data: Path) -> None:
    result = CliRunner().invoke(main, ["report"])
    assert result.exit_code == 0, result.output
    assert "no day has been evaluated yet" in result.output
    assert "lanes run --date" in result.output and "lanes backfill" in result.output
    assert not (data / "reports").exists()


def test_a_corrupt_learning_file_is_named(data: Path) -> None:
    store = store_points(three_points())
    broken = store.folder("adapter_evaluation", "2026-11-02") / "learning.json"
    broken.write_text('{"day": "2026-11-02", "served": ')
    with pytest.raises(LearningReportError, match=str(broken)):
        load_points(store)
    result = CliRunner().invoke(main, ["report"])
    assert result.exit_code == 1 and str(broken) in result.output


def test_a_point_filed_under_another_day_is_named(data: Path) -> None:
    store = store_points(three_points()[:1])
    moved = store.folder("adapter_evaluation", "2026-11-05") / "learning.json"
    store.write_json(
        "adapter_evaluation", "2026-11-05", "learning.json", three_points()[0].model_dump(mode="json")
    )
    with pytest.raises(LearningReportError, match=f"{moved}: day 2026-11-01 does not match"):
        load_points(store)

"""The learning curve: per day, the base model, the day's candidate and what the stable alias serves, on
the editor's figure (completion edit similarity), `repo_pass_rate`, the anchor set, held-out eval loss and
HumanEval pass@1, each with its 95% interval.

`adapter_evaluation` writes one `LearningPoint` a day to `<artifacts>/adapter_evaluation/<day>/learning.json`;
this module reads them back (sorted by day) and turns them into a Markdown table, a PNG chart, the one line
`lanes run` prints for the day and the float metadata Dagster's Plots tab draws over partitions. Everything
here is pure apart from reading the store and writing the chart file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from pathlib import Path

from pydantic import ValidationError

from lanes_pipeline.gpu_lane.promotion import Figures, LearningPoint
from lanes_pipeline.store import ArtifactStore

LEARNING_ASSET = "adapter_evaluation"
LEARNING_FILE = "learning.json"

# (metadata / column stem, label, Figures field, is a share shown as a percentage)
_FIGURES: tuple[tuple[str, str, str, bool], ...] = (
    ("completion_edit_similarity", "completion edit similarity", "completion_edit_similarity", True),
    ("repo_pass_rate", "repo_pass_rate", "repo_pass_rate", True),
    ("anchor_pass_rate", "anchor pass rate", "anchor_pass_rate", True),
    ("eval_loss", "eval loss", "eval_loss", False),
    ("humaneval_pass1", "HumanEval pass@1", "humaneval_pass1", True),
)
_SIDES = (("base", "tab:gray", "o--"), ("candidate", "tab:green", "s:"), ("served", "tab:blue", "o-"))


def _side(point: LearningPoint, side: str) -> Figures:
    return {"base": point.base, "candidate": point.candidate_figures, "served": point.served_figures}[side]


class LearningReportError(ValueError):
    """A learning.json that cannot be read as a LearningPoint; the message names the file."""


def _load_point(path: Path) -> LearningPoint:
    try:
        point = LearningPoint.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
        raise LearningReportError(f"{path}: not a readable learning point: {exc}") from None
    # The folder is the day's partition: a point filed under another day would put it on the wrong day.
    if point.day.isoformat() != path.parent.name:
        raise LearningReportError(
            f"{path}: day {point.day.isoformat()} does not match its partition folder {path.parent.name!r}"
        )
    return point


def load_points(store: ArtifactStore) -> list[LearningPoint]:
    """Every day's point in the store, sorted by day; [] when no day has been evaluated yet."""
    folder = store.root / LEARNING_ASSET
    if not folder.is_dir():
        return []
    files = [
        day / LEARNING_FILE
        for day in folder.iterdir()
        # dot-folders are the store's staging folders, never a partition
        if day.is_dir() and not day.name.startswith(".") and (day / LEARNING_FILE).is_file()
    ]
    return sorted((_load_point(path) for path in files), key=lambda point: point.day)


def _value(figures: Figures, field: str) -> float | None:
    value = getattr(figures, field)
    return None if value is None else float(value)


def _format(value: float | None, share: bool) -> str:
    if value is None:
        return "-"
    if share:
        # one decimal at most: 0.15 -> "15%", 0.025 -> "2.5%"
        return f"{value * 100:.1f}".rstrip("0").rstrip(".") + "%"
    return f"{value:.2f}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(points: Sequence[LearningPoint]) -> str:
    """One row a day: what was served, the day's candidate and decision, base vs served on each figure."""
    header = ["day", "served", "candidate", "promoted", "primary p"]
    for _key, label, _field, _share in _FIGURES:
        header += [f"{label} base", f"{label} candidate", f"{label} served"]
    header += ["evaluation", "note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for point in points:
        row = [
            point.day.isoformat(),
            point.served,
            point.candidate or "no adapter today",
            "yes" if point.promoted else "no",
            "-" if point.p_value is None else f"{point.p_value:.3g}",
        ]
        for _key, _label, field, share in _FIGURES:
            row += [_format(_value(_side(point, side), field), share) for side, _c, _s in _SIDES]
        row += [_duration(point), point.note]
        lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    return "\n".join(lines)


def learning_line(point: LearningPoint) -> str:
    """The day's line for `lanes run`'s summary, e.g. "learning 2026-11-02: served lanes-2026-11-02
    repo_pass_rate 15% (base 10%), eval loss 1.23 (base 1.50), HumanEval 2.5% (base 2.5%)"."""
    short = {
        "completion_edit_similarity": "completion similarity",
        "repo_pass_rate": "repo_pass_rate",
        "anchor_pass_rate": "anchor",
        "eval_loss": "eval loss",
        "humaneval_pass1": "HumanEval",
    }
    parts = [
        f"{short[key]} {_format(_value(point.served_figures, field), share)} "
        f"(base {_format(_value(point.base, field), share)})"
        for key, _label, field, share in _FIGURES
    ]
    line = f"learning {point.day.isoformat()}: served {point.served} " + ", ".join(parts)
    if point.candidate is not None and not point.promoted:
        line += f"; candidate {point.candidate} not promoted"
        if point.p_value is not None:
            line += f" ({point.primary_figure} p = {point.p_value:.3g})"
    if point.evaluation_s is not None:
        line += f"; evaluated in {_duration(point)}"
    return line + (f"; {point.note}" if point.note else "")


def _duration(point: LearningPoint) -> str:
    """How long the day's evaluation took and how many answers it asked vLLM ("-": nothing was judged)."""
    if point.evaluation_s is None:
        return "-"
    minutes, seconds = divmod(round(point.evaluation_s), 60)
    asked = f", {point.requests} answers asked" if point.requests is not None else ""
    return f"{minutes} min {seconds:02d} s{asked}"


def plot_metadata(point: LearningPoint) -> dict[str, float]:
    """Float metadata for the day's MaterializeResult (Dagster plots each key over partitions): base_*,
    candidate_* and served_* for each figure, only those measured, so an unmeasured figure leaves a gap,
    not a zero."""
    metadata: dict[str, float] = {}
    for side in ("base", "candidate", "served"):
        figures = _side(point, side)
        for key, _label, field, _share in _FIGURES:
            value = _value(figures, field)
            if value is not None:
                metadata[f"{side}_{key}"] = value
    return metadata


def _series(
    points: Sequence[LearningPoint], side: str, field: str, scale: float
) -> tuple[list[date], list[float], list[list[float]]]:
    """The days a side measured `field`, its values, and the error bars (below, above) of its interval
    (0 where it has none)."""
    days, values, below, above = [], [], [], []
    for point in points:
        figures = _side(point, side)
        value = _value(figures, field)
        if value is None:
            continue
        low, high = figures.intervals.get(field, (value, value))
        days.append(point.day)
        values.append(value * scale)
        below.append(max(0.0, (value - low) * scale))
        above.append(max(0.0, (high - value) * scale))
    return days, values, [below, above]


def render_chart(points: Sequence[LearningPoint], path: Path) -> Path:
    """One panel per figure over the days: base, the day's candidate (promoted or not) and the served
    alias side by side, each with its 95% interval; unmeasured values are left out; promoted days are
    starred. Returns `path`."""
    if not points:
        raise ValueError("no learning points to chart: no day has been evaluated yet")
    # A Figure without pyplot renders through the Agg canvas: no display, no global backend switch.
    from matplotlib.dates import DateFormatter, DayLocator
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 2.6 * len(_FIGURES)), constrained_layout=True)
    axes = fig.subplots(len(_FIGURES), 1, sharex=True)
    ordered = sorted(points, key=lambda point: point.day)
    # Three sides a day, moved apart by a few hours so that equal figures do not hide one another.
    shift = {"base": timedelta(hours=-5), "candidate": timedelta(0), "served": timedelta(hours=5)}
    for axis, (_key, label, field, share) in zip(axes, _FIGURES, strict=True):
        scale = 100.0 if share else 1.0
        for side, color, style in _SIDES:
            days, values, errors = _series(ordered, side, field, scale)
            moved = [datetime.combine(day, time(12)) + shift[side] for day in days]
            axis.errorbar(moved, values, yerr=errors, fmt=style, color=color, capsize=3, label=side)
        promoted = [p for p in ordered if p.promoted]
        days, values, _ = _series(promoted, "served", field, scale)
        moved = [datetime.combine(day, time(12)) + shift["served"] for day in days]
        axis.plot(moved, values, "*", color="tab:orange", markersize=12, label="promoted that day")
        if not any(_value(_side(p, side), field) is not None for p in ordered for side, _c, _s in _SIDES):
            axis.text(0.5, 0.5, "not measured on any day", transform=axis.transAxes, ha="center", va="center")
        axis.set_ylabel(f"{label} (%)" if share else label)
        axis.grid(True, alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    first, last = ordered[0].day, ordered[-1].day
    # whole days only (a partition is a day), at most ~12 labels however long the curve
    axes[-1].xaxis.set_major_locator(DayLocator(interval=max(1, (last - first).days // 12 + 1)))
    axes[-1].xaxis.set_major_formatter(DateFormatter("%Y-%m-%d"))
    fig.autofmt_xdate()
    fig.suptitle(f"learning curve {first.isoformat()} .. {last.isoformat()}: base, candidate, served alias")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png")
    return path

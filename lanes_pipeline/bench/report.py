"""The benchmark report: `data/bench/report.json` as a typed model, and its Markdown (`report.md` beside it,
and `docs/benchmarks.md`, the project's measurements, written from it by
`python -m lanes_pipeline.bench --docs`).

Each benchmark's entry is its own run: benchmarks run one at a time (hours each on two cores), so the
report keeps the latest run of every one, each with its date, machine, wall time and config folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DOCS_COMMAND = "python -m lanes_pipeline.bench --docs"


class BenchReportError(Exception):
    """A report file that cannot be read as one; it is named and never overwritten."""


class BenchEntry(BaseModel):
    """`results.NAME`: a benchmark's own figures (its keys are its own), plus where and when it ran."""

    model_config = ConfigDict(extra="allow")

    started: str | None = None
    machine: str | None = None
    wall_s: float | None = None
    config_dir: str | None = None
    markdown: str | None = None

    def figures(self) -> dict[str, Any]:
        """The benchmark's own keys, without the run's bookkeeping and its rendered table."""
        return dict(self.model_extra or {})


class BenchReport(BaseModel):
    started: str | None = None
    machine: str | None = None
    results: dict[str, BenchEntry] = Field(default_factory=dict)


def read_report(path: Path) -> BenchReport:
    """The report at `path` (an empty one when there is none yet)."""
    if not path.exists():
        return BenchReport()
    try:
        return BenchReport.model_validate(json.loads(path.read_text()))
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise BenchReportError(f"{path}: not a benchmark report ({wrong}); move it away") from exc
    except ValueError as exc:
        raise BenchReportError(f"{path}: not a benchmark report ({exc}); move it away") from exc


def _cell(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def figures_table(figures: dict[str, Any]) -> str:
    """A benchmark without a table of its own: one row per top-level figure (nested ones as JSON)."""
    lines = ["| figure | value |", "|---|---|"]
    lines += [f"| `{key}` | {_cell(value)} |" for key, value in figures.items()]
    return "\n".join(lines)


def entry_markdown(name: str, entry: BenchEntry, machine: str | None) -> str:
    ran = f"run {entry.started or 'at an unknown time'} on {entry.machine or machine or 'an unknown machine'}"
    took = f", {entry.wall_s:.0f} s" if entry.wall_s is not None else ""
    lines = [f"## {name}", "", f"`python -m lanes_pipeline.bench {name}`: {ran}{took}.", ""]
    lines.append(entry.markdown or figures_table(entry.figures()))
    return "\n".join(lines)


def doc_sections(markdown: str) -> dict[str, str]:
    """The `## NAME` sections of a benchmarks page written by `report_markdown`, by name."""
    sections: dict[str, str] = {}
    for chunk in markdown.split("\n## ")[1:]:
        name = chunk.split("\n", 1)[0].strip()
        sections[name] = ("## " + chunk).rstrip()
    return sections


def report_markdown(report: BenchReport, source: str, kept: dict[str, str] | None = None) -> str:
    """The whole report as Markdown: one section per benchmark, each with its table, machine and date.
    `kept`: sections of an earlier page for benchmarks this report has no run of (a fresh clone has the
    page, not the report it came from), kept word for word."""
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{DOCS_COMMAND}` from `{source}`; do not edit by hand.",
        "Each benchmark starts its own servers on free ports in an empty data folder;",
        "`python -m lanes_pipeline.bench NAME` runs one again and replaces its section only.",
        "",
    ]
    sections = {name: section for name, section in (kept or {}).items() if name not in report.results}
    sections |= {name: entry_markdown(name, entry, report.machine) for name, entry in report.results.items()}
    if not sections:
        lines.append("No benchmark has been run yet.")
    for _, section in sorted(sections.items()):
        lines += [section, ""]
    return "\n".join(lines).rstrip() + "\n"

"""The table a user would post, and a PNG chart of the same trials: pure rows first, then the rendering."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from lanes_pipeline.observatory.registry import TrialRecord

COLUMNS = (
    "trial",
    "model",
    "quant",
    "lane",
    "threads/slots",
    "TTFT s",
    "PP tok/s",
    "TG tok/s",
    "TG@slots",
    "p95 s",
    "prefix hit",
    "params B active/total",
    "PF",
    "PF total",
    "interference",
)


class CompareRow(BaseModel):
    """One trial's figures as the table shows them (None: not measured / failed)."""

    model_config = ConfigDict(frozen=True)

    name: str
    lane: str
    engine: str
    model: str
    quant: str
    threads: int | None
    slots: int
    ttft_s: float | None
    prompt_tok_s: float | None
    generation_tok_s: float | None
    generation_tok_s_slots: float | None
    p95_s: float | None
    prefix_hit: float | None
    active_params_b: float | None
    total_params_b: float | None
    pf: float | None
    pf_total: float | None
    interference: float | None
    error: str | None = None


def compare_row(record: TrialRecord) -> CompareRow:
    f, p = record.figures, record.params
    return CompareRow(
        name=record.name,
        lane=record.lane,
        engine=record.engine,
        model=record.model,
        quant=record.quant,
        threads=record.threads,
        slots=record.slots,
        ttft_s=f.ttft_s if f else None,
        prompt_tok_s=f.prompt_tok_s if f else None,
        generation_tok_s=f.generation_tok_s if f else None,
        generation_tok_s_slots=f.generation_tok_s_slots if f else None,
        p95_s=f.p95_s if f else None,
        prefix_hit=f.prefix_hit if f else None,
        active_params_b=p.active_params_b if p else None,
        total_params_b=p.total_params_b if p else None,
        pf=f.pf if f else None,
        pf_total=f.generation_tok_s / p.total_params_b if f and p else None,
        interference=record.interference,
        error=None if record.ok else (record.error or "failed"),
    )


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _params(active: float | None, total: float | None) -> str:
    if active is None or total is None:
        return "-"
    return f"{active:.3g}" if active == total else f"{active:.3g}/{total:.3g}"


def cells(row: CompareRow) -> list[str]:
    threads = "-" if row.threads is None else str(row.threads)
    figures = [
        _num(row.ttft_s),
        _num(row.prompt_tok_s, 1),
        _num(row.generation_tok_s, 1),
        _num(row.generation_tok_s_slots, 1),
        _num(row.p95_s),
        _pct(row.prefix_hit),
        _params(row.active_params_b, row.total_params_b),
        _num(row.pf, 1),
        _num(row.pf_total, 1),
        _num(row.interference),
    ]
    if row.error:
        figures = [f"FAILED: {row.error[:60]}"] + [""] * (len(figures) - 1)
    lane = f"{row.lane} ({row.engine})" if row.engine else row.lane
    return [row.name, row.model, row.quant, lane, f"{threads}/{row.slots}", *figures]


def markdown_table(rows: list[CompareRow]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def write_chart(rows: list[CompareRow], path: Path) -> Path:
    """Bars per trial: generation tok/s (1 request and at slots), prompt tok/s, PF; failed trials left out."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    measured = [row for row in rows if row.error is None and row.generation_tok_s is not None]
    if not measured:
        raise ValueError("no measured trial to chart")
    panels = (
        ("generation tok/s (1 request)", "generation_tok_s"),
        ("generation tok/s (at slots)", "generation_tok_s_slots"),
        ("prompt tok/s (long prompt)", "prompt_tok_s"),
        ("PF: tok/s per B active params", "pf"),
        ("TTFT s", "ttft_s"),
        ("p95 latency s", "p95_s"),
    )
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    labels = [f"{r.name}\n{r.quant} {r.threads or '-'}/{r.slots}" for r in measured]
    colours = ["tab:blue" if r.lane == "cpu" else "tab:orange" for r in measured]
    for axis, (title, field) in zip(axes.flat, panels, strict=True):
        values = [getattr(r, field) or 0.0 for r in measured]
        axis.bar(range(len(measured)), values, color=colours)
        axis.set_title(title)
        axis.set_xticks(range(len(measured)), labels, rotation=45, ha="right", fontsize=7)
    fig.suptitle("lanes trials (blue: CPU lane, orange: GPU lane)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

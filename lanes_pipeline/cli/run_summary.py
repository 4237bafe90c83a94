"""The summary `lanes run` prints after a day: one row per asset, the day's results, and what the lanes were
asked. Pure: it reads plain metadata (asset -> {key: value}) and server counter deltas, and returns text.

The LLM-call count comes from two sides that must agree: the CPU-lane resource's own count of requests it
sent (`llm_requests` in each asset's metadata) and what llama-server says it computed (`/metrics` token
counters before and after). A re-run of a day shows 0 on both, which is the proof that it asked nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from lanes_pipeline.cpu_lane.jobs.rows import (
    AnalysisFigures,
    GeneratedDocsFigures,
    GeneratedTestsFigures,
    LaneUsageFigures,
    RefactorFigures,
    ReviewFigures,
    SnapshotFigures,
)
from lanes_pipeline.daily.artifacts import Figures
from lanes_pipeline.dataset.writer import DatasetFigures

Status = Literal["materialized", "failed", "skipped"]
FiguresT = TypeVar("FiguresT", bound=Figures)


class AssetOutcome(BaseModel):
    asset: str
    partition: str | None
    status: Status
    metadata: dict[str, Any] = {}


class LaneDeltas(BaseModel):
    """What the servers counted during the day's assets (probes excluded): None where unreadable."""

    cpu_prompt_tokens: float | None = None
    cpu_generated_tokens: float | None = None
    gpu_requests: float | None = None


class ServedState(BaseModel):
    """What vLLM serves after the run, read from its /v1/models."""

    alias: str
    target: str | None  # the version the alias's folder belongs to, None when the alias is not loaded
    loaded: list[str]


class DaySummary(BaseModel):
    partition: str
    rows: list[AssetOutcome]
    llm_calls: int
    cache_hits: int
    tests_accepted: int | None
    diffs_accepted: int | None
    dataset_rows: int | None
    adapter_version: str | None
    promoted: bool | None
    served: ServedState | None
    deltas: LaneDeltas
    learning: str | None = None  # the day's point of the learning curve (adapter_evaluation's `learning`)
    # `repo: symbol id` -> why the pipeline could not handle it (the assets' `skipped`): left out of the day
    skipped: dict[str, str] = {}
    # The commands that show each review branch of the day (review_branch's `review_commands`)
    review_commands: list[str] = []

    @property
    def asked_nothing(self) -> bool:
        """The day's work made no LLM call: the CPU-lane resource sent none, llama-server computed none, and
        vLLM finished no request (evaluation, smoke tests) where its counter could be read."""
        return (
            self.llm_calls == 0
            and self.deltas.cpu_prompt_tokens == 0
            and self.deltas.cpu_generated_tokens == 0
            and self.deltas.gpu_requests in (None, 0)
        )


def _of(rows: Sequence[AssetOutcome], asset: str) -> dict[str, Any]:
    return next((r.metadata for r in rows if r.asset == asset and r.status == "materialized"), {})


def _figures(rows: Sequence[AssetOutcome], asset: str, model: type[FiguresT]) -> FiguresT | None:
    """The figures a CPU-lane asset recorded, read with the model it wrote them with; None when the asset
    did not materialize in this run."""
    metadata = next((r.metadata for r in rows if r.asset == asset and r.status == "materialized"), None)
    return None if metadata is None else model.read(metadata)


def summarize_day(
    partition: str, rows: Sequence[AssetOutcome], deltas: LaneDeltas, served: ServedState | None
) -> DaySummary:
    usage = [LaneUsageFigures.read(r.metadata) for r in rows if LaneUsageFigures.recorded_in(r.metadata)]
    tests, diffs = (
        _figures(rows, "generated_tests", GeneratedTestsFigures),
        _figures(rows, "refactor_proposals", RefactorFigures),
    )
    dataset = _figures(rows, "lora_dataset", DatasetFigures)
    adapter = _of(rows, "lora_adapter")
    evaluation, serving = _of(rows, "adapter_evaluation"), _of(rows, "served_adapter")
    promoted = serving.get("promoted", evaluation.get("promote"))
    return DaySummary(
        partition=partition,
        rows=list(rows),
        llm_calls=sum(u.llm_requests for u in usage),
        cache_hits=sum(u.cache_hits for u in usage),
        tests_accepted=tests.accepted if tests else None,
        diffs_accepted=diffs.accepted if diffs else None,
        dataset_rows=dataset.row_count if dataset else None,
        adapter_version=adapter.get("version"),
        promoted=bool(promoted) if promoted is not None else None,
        served=served,
        deltas=deltas,
        learning=evaluation.get("learning"),
        skipped={
            k: v for r in rows if r.status == "materialized" for k, v in r.metadata.get("skipped", {}).items()
        },
        review_commands=list(_of(rows, "review_branch").get("review_commands", [])),
    )


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _adapter_result(m: Mapping[str, Any]) -> str:
    if "no_adapter" in m:  # a quiet day: lora_adapter says why it trained nothing
        return f"no adapter: {m['no_adapter']}"
    reused = " (reused)" if m.get("reused_existing_version") else ""
    return f"{m.get('version')}{reused}, loss {_cell(m.get('final_loss'), 3)}"


def _snapshot(m: Mapping[str, Any]) -> str:
    f = SnapshotFigures.read(m)
    return f"{f.files} files, {f.changed_files} changed"


def _analysis(m: Mapping[str, Any]) -> str:
    f = AnalysisFigures.read(m)
    return (
        f"{f.analysed_ok} of {f.items} symbols analysed ({f.files} files), {f.accepted} accepted; coverage "
        f"{f.symbols_analysed} of {f.symbols} symbols ({f.analysis_coverage:.0%})"
    )


def _tests(m: Mapping[str, Any]) -> str:
    f = GeneratedTestsFigures.read(m)
    line = (
        f"{f.accepted} of {f.candidates} tests accepted; coverage {f.symbols_with_accepted_test} of "
        f"{f.symbols} symbols ({f.test_coverage:.0%})"
    )
    if f.modules_not_importable:
        line += f"; {f.modules_not_importable} module(s) not asked, they do not import: {f.import_problem}"
    return line


def _docs(m: Mapping[str, Any]) -> str:
    f = GeneratedDocsFigures.read(m)
    return (
        f"{f.accepted} of {f.candidates} docstrings accepted; coverage {f.symbols_with_accepted_docs} of "
        f"{f.symbols} symbols ({f.docs_coverage:.0%})"
    )


def _diffs(m: Mapping[str, Any]) -> str:
    f = RefactorFigures.read(m)
    return (
        f"{f.accepted} of {f.proposals} diffs accepted; coverage {f.symbols_with_accepted_proposal} of "
        f"{f.symbols} symbols ({f.proposal_coverage:.0%})"
    )


def _review(m: Mapping[str, Any]) -> str:
    f = ReviewFigures.read(m)
    if not f.branches:
        return "no review branch: no accepted item became a commit"
    return (
        f"{f.commits} commits on {f.branches} review branch(es), {f.items_skipped} items left off; "
        f"tests pass at {f.tips_passing} of {f.branches} tips"
    )


def _dataset(m: Mapping[str, Any]) -> str:
    f = DatasetFigures.read(m)
    return f"{f.train_rows} train + {f.eval_rows} eval rows"


# The one figure that says what each asset produced, from its metadata: the CPU lane's through the figure
# models its assets write with (cpu_lane/jobs/rows.py).
RESULTS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "repo_snapshot": _snapshot,
    "day_symbols": lambda m: f"{m.get('symbols_chosen', 0)} symbols ({m.get('changed_symbols', 0)} changed)",
    "repo_analysis": _analysis,
    "generated_tests": _tests,
    "generated_docs": _docs,
    "refactor_proposals": _diffs,
    "verified_bodies": lambda m: (
        f"{m.get('bodies_accepted', 0)} of {m.get('bodies/sampled', 0)} sampled bodies passed; "
        f"{m.get('targets_testable', 0)} of {m.get('targets', 0)} functions with tests that judge"
    ),
    "accepted_work": lambda m: f"{m.get('candidates', 0)} accepted results",
    "review_branch": _review,
    "held_out_tasks": lambda m: (
        f"{m.get('held_out_tasks', 0)} held-out tasks, {m.get('functions_to_teach', 0)} functions to teach"
    ),
    "lora_dataset": _dataset,
    "lora_adapter": _adapter_result,
    "adapter_evaluation": lambda m: (
        "no adapter" if "no_adapter" in m else ("promote" if m.get("promote") else "reject")
    ),
    "served_adapter": lambda m: f"{m.get('alias')} -> {m.get('alias_target')}",
}


def _result(row: AssetOutcome) -> str:
    m = row.metadata
    if row.status != "materialized":
        return ""
    if "speed_source" in m:  # a lane probe
        return f"{m.get('completion_tokens', 0)} tokens, {_cell(m.get('latency_s'), 2)} s"
    describe = RESULTS.get(row.asset)
    return describe(m) if describe else ""


SHOWN_SKIPPED = 5
HEADER = ("asset", "status", "LLM calls", "cache hits", "tok/s", "prefix reuse (limit)", "result")


def render(summary: DaySummary) -> str:
    table = [HEADER]
    for row in summary.rows:
        m = row.metadata
        if LaneUsageFigures.recorded_in(m):  # a CPU-lane asset: speed and reuse only if it asked anything
            usage = LaneUsageFigures.read(m)
            answered = usage.llm_answered > 0
            calls, hits = usage.llm_requests, usage.cache_hits
            speed = usage.generation_tokens_per_s if answered else None
            # The reuse beside the layout's limit: what a perfect prefix cache could have served.
            reuse = f"{usage.prefix_reuse:.0%} ({usage.prefix_reuse_limit:.0%})" if answered else "-"
        else:  # a lane probe (one call, its speed) or a GPU-lane asset
            calls, hits = (1 if "speed_source" in m else None), m.get("cache_hits")
            speed, reuse = m.get("generation_tokens_per_s"), "-"
        table.append(
            (
                row.asset,
                row.status,
                _cell(calls),
                _cell(hits),
                _cell(speed),
                reuse,
                _result(row),
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    d = summary.deltas
    lines.append("")
    if summary.asked_nothing:
        gpu = ", vLLM finished 0 requests" if d.gpu_requests is not None else ""
        lines.append(
            "  LLM calls for the day's work: 0 "
            f"(llama-server computed 0 prompt and 0 generated tokens{gpu}): a re-run of {summary.partition}, "
            f"every answer from the cache (cache hits: {summary.cache_hits})"
        )
    else:
        lines.append(
            f"  LLM calls for the day's work: {summary.llm_calls} to the CPU lane "
            f"(llama-server computed {_cell(d.cpu_prompt_tokens, 0)} prompt and "
            f"{_cell(d.cpu_generated_tokens, 0)} generated tokens), cache hits: {summary.cache_hits}"
        )
        if d.gpu_requests is not None:
            lines.append(
                "  GPU lane requests during the day's assets "
                f"(executed evaluation tasks, promotion smoke tests): {d.gpu_requests:g}"
            )
    served = "-"
    if summary.served is not None:
        served = (
            f"yes ({summary.served.alias} -> {summary.served.target})"
            if summary.served.target
            else f"no ({summary.served.alias} is not loaded)"
        )
    lines.append(
        f"  tests accepted {_cell(summary.tests_accepted)}, diffs accepted {_cell(summary.diffs_accepted)}, "
        f"dataset {_cell(summary.dataset_rows)} rows, adapter {_cell(summary.adapter_version)}, "
        f"promoted {_cell(summary.promoted)}, served {served}"
    )
    if summary.skipped:
        lines.append(f"  {len(summary.skipped)} symbol(s) skipped, the day went on without them:")
        lines += [f"    {symbol}: {why}" for symbol, why in list(summary.skipped.items())[:SHOWN_SKIPPED]]
        if len(summary.skipped) > SHOWN_SKIPPED:
            lines.append(
                f"    ... and {len(summary.skipped) - SHOWN_SKIPPED} more (repo_analysis's `skipped`)"
            )
    if summary.learning:
        lines.append(f"  {summary.learning}  (the curve over the days: lanes report)")
    # Last, as the run's closing words: where the day's work is, and the command that shows it.
    for command in summary.review_commands:
        branch = command.rsplit("..", 1)[-1]
        lines.append(f"  The day's work is on the branch {branch}; read it with: {command}")
    return "\n".join(lines)

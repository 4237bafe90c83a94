"""`python -m lanes_pipeline.bench trials`: every shipped trial (configs/trials.yaml) on its own private
server, one after another, recorded in the trial registry too; `results.trials.rows` holds one object per
trial, failed ones with their error instead of figures. Each row says whether the model is a mixture of
experts, its active and total parameters (from the GGUF's tensors), and PF per billion of each.

`LANES_BENCH_TRIALS` (comma-separated names) picks some; `LANES_BENCH_TRIALS_WORKLOAD` (small | default)
sizes them (small by default: the whole set must fit a busy two-core machine). The other lane is measured
against only when one is already running (`lanes serve`), so this benchmark starts no second vLLM.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from lanes_pipeline.config.trials import load_trials
from lanes_pipeline.observatory.compare import compare_row, markdown_table
from lanes_pipeline.observatory.registry import TrialRecord, TrialRegistry, registry_path
from lanes_pipeline.observatory.trials import run_trial
from lanes_pipeline.observatory.workload import WORKLOADS, Workload
from lanes_pipeline.settings import Settings


class TrialRow(BaseModel):
    """One row of `results.trials.rows`."""

    name: str
    lane: str
    model: str
    quant: str
    ttft_s: float | None
    prompt_tok_s: float | None
    generation_tok_s: float | None
    p95_s: float | None
    prefix_hit: float | None
    moe: bool | None
    active_params_b: float | None
    total_params_b: float | None
    pf: float | None  # generation tok/s (one request) per billion active parameters
    pf_total: float | None  # the same per billion parameters in all
    interference: float | None
    read_back: dict[str, str]  # the settings the server's log reported (fused_moe, ser, ...)
    error: str | None = None


def trial_row(record: TrialRecord) -> TrialRow:
    f, p = record.figures, record.params

    def rounded(value: float | None, digits: int = 3) -> float | None:
        return None if value is None else round(value, digits)

    return TrialRow(
        name=record.name,
        lane=record.lane,
        model=record.model,
        quant=record.quant,
        ttft_s=rounded(f.ttft_s) if f else None,
        prompt_tok_s=rounded(f.prompt_tok_s, 1) if f else None,
        generation_tok_s=rounded(f.generation_tok_s, 2) if f else None,
        p95_s=rounded(f.p95_s) if f else None,
        prefix_hit=rounded(f.prefix_hit) if f else None,
        moe=p.moe if p else None,
        active_params_b=rounded(p.active_params_b, 4) if p else None,
        total_params_b=rounded(p.total_params_b, 4) if p else None,
        pf=rounded(f.pf, 2) if f else None,
        pf_total=rounded(f.generation_tok_s / p.total_params_b, 2) if f and p else None,
        interference=rounded(record.interference),
        read_back=record.read_back,
        error=None if record.ok else record.error,
    )


def run(settings: Settings) -> dict[str, Any]:
    trials = load_trials(settings.config_dir).trials
    wanted = [n.strip() for n in os.environ.get("LANES_BENCH_TRIALS", "").split(",") if n.strip()]
    if wanted:
        trials = [t for t in trials if t.name in wanted]
    workload = os.environ.get("LANES_BENCH_TRIALS_WORKLOAD", "small")
    if workload not in WORKLOADS:
        raise ValueError(f"LANES_BENCH_TRIALS_WORKLOAD: unknown {workload!r}; known: {', '.join(WORKLOADS)}")
    work = WORKLOADS[workload]
    records: list[TrialRecord] = []
    with TrialRegistry(registry_path(settings.data_dir)) as registry:
        for spec in trials:  # each trial stops its own server, also on Ctrl-C / SIGTERM (bench's handler)
            record = run_trial(spec, settings, work, other="running")
            registry.add(record)
            records.append(record)
    return {
        "workload": {"name": workload} | work.model_dump(),
        "rows": [trial_row(r).model_dump() for r in records],
        "failed": [r.name for r in records if not r.ok],
        "markdown": workload_line(workload, work) + markdown_table([compare_row(r) for r in records]),
    }


def workload_line(name: str, work: Workload) -> str:
    """What each row's figures were measured on, so their noise can be judged: a speed from one answer of a
    dozen tokens differs a lot between two runs of the same trial."""
    return (
        f"Workload `{name}` (`LANES_BENCH_TRIALS_WORKLOAD`): TTFT and TG from {work.single_requests} "
        f"streamed answer(s) of {work.max_tokens} tokens, PP from {work.long_prompt_requests} prompt(s) of "
        f"{work.long_prompt_blocks} code blocks, TG@slots from {work.requests_per_slot} request(s) per slot, "
        f"prefix hit from {work.prefix_requests} requests sharing a repository map.\n\n"
    )

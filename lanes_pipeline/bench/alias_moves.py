"""`alias_moves` (run when named): the alias moved many times while editors keep asking it, on the embedded
vLLM, between random adapters. The gpu_lane benchmark moves it a few times between trained adapters for its
hot-swap latency; this one asks whether a move ever fails an editor's request, with enough moves to see a
rare refusal: requests answered and refused (with vLLM's words), and the moves' latency."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from lanes_pipeline.bench.gpu_lane import EDITORS, hot_swap
from lanes_pipeline.embedded import engines
from lanes_pipeline.observatory.adapter import random_adapter
from lanes_pipeline.settings import Settings

MOVES = 60
VERSIONS = 3


def run(settings: Settings) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="lanes-bench-alias-moves-"))
    try:
        base = engines.embedded_hf_model(settings.data_dir)
        versions = [
            random_adapter(base, work / "adapters" / f"bench-2026-11-0{i + 1}", rank=8, seed=i)
            for i in range(VERSIONS)
        ]
        figures = hot_swap(settings, work, versions, moves=MOVES)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures | {"markdown": _markdown(figures)}


def _markdown(f: dict[str, Any]) -> str:
    lines = [
        f"The alias moved {f['alias_moves']} times among {VERSIONS} adapters while {EDITORS} editors kept "
        f"asking it: **{f['failed_interactive_requests']} of {f['interactive_requests']} requests refused** "
        f"at the first try, {f['failed_after_one_retry']} when asked once more. "
        f"A move (load, check, alias, check): median {f['hot_swap_s_median']} s, max {f['hot_swap_s_max']} s "
        f"under load; {f['hot_swap_idle_s_median']} s idle ({f['idle_moves']} moves).",
    ]
    lines += [f"- refused: {failure}" for failure in f["failures"]]
    return "\n".join(lines)

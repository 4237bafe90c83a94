"""`judge_cost`: what a day's evaluation costs on this machine, and what its levers save, side by side on
one embedded vLLM (free port, empty data folder), the base model, the same tasks:

- `completion`: held-out completion points of a real package (tabulate 0.9.0, the learning benchmark's
  second repository), asked with the contract's window (`sliding`: the text right before the cut, up to
  completion_context_chars) and with a window whose start lies on a grid, so that the points of a function
  share their prompt's start and vLLM computes it once (`grid`): seconds, prompt tokens, vLLM's prefix-cache
  hit rate, mean edit similarity of the scored line. The grid is not the contract's: on vLLM's CPU build a
  prompt whose prefix is cached is answered differently from the same prompt computed whole (1 of 4 greedy
  continuations changed for the base, 2 of 4 for an adapter), which would make a candidate's answers
  depend on what was asked before them;
- `answers`: anchor tasks answered and judged with the earlier defaults (`before`: 4 requests at once, no
  loop stop) and the shipped ones (`after`): seconds, tokens, tasks passed, finish reasons, and how many
  verdicts differ between the two.

`JUDGE_COST_POINTS` and `JUDGE_COST_ANCHORS` size it (120 and 40: a few minutes on two cores).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

from lanes_pipeline.bench.cpu_yield import empty_data_dir
from lanes_pipeline.bench.real_package import build_release_repo
from lanes_pipeline.config.models import ExecutedEvalConfig
from lanes_pipeline.dataset.completion_points import CompletionPoint
from lanes_pipeline.dataset.contract import at_cut, completion_prompt
from lanes_pipeline.dataset.held_out_tasks import completion_of_repo
from lanes_pipeline.dataset.holdout_rules import held_out_symbols
from lanes_pipeline.embedded.servers import build_server
from lanes_pipeline.gpu_lane.anchor_set import anchor_subset, load_anchor_set
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.completion import first_line, score_line
from lanes_pipeline.gpu_lane.judge_tasks import DayTasks, plans
from lanes_pipeline.gpu_lane.judged import EDIT_SIMILARITY, PASSED
from lanes_pipeline.http import CompletionRequest
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.settings import Settings, data_dir

PACKAGE, RELEASE, MODULE = "tabulate", "0.9.0", "tabulate/__init__.py"


def grid_prompt(path: str, prefix: str, context_chars: int) -> str:
    """The window whose start lies on a grid of half `context_chars` in the file: the whole lines that start
    at or after the first grid point at most `context_chars` before the cut (half to all of it)."""
    start = 0
    if len(prefix) > context_chars:
        stride = max(1, context_chars // 2)
        start = -(-(len(prefix) - context_chars) // stride) * stride  # up to the grid
    lines = [f"{line}\n" for line in prefix.split("\n")[:-1]]
    offset, kept = 0, []
    for line in lines:
        if offset >= start:
            kept.append(line)
        offset += len(line)
    return at_cut(f"# {path}\n" + "".join(kept))


def package_points(root: Path, count: int) -> tuple[list[CompletionPoint], dict[str, str]]:
    built = build_release_repo(root / "repo", root / "downloads", date(2026, 11, 1), PACKAGE, (RELEASE,))
    commit = built.releases[-1].commit
    held = held_out_symbols(PACKAGE, symbols_at(built.path, commit, [MODULE]).symbols, 50)
    points, sources = completion_of_repo(PACKAGE, built.path, commit, held)
    return sorted(points, key=lambda p: p.id)[:count], sources


def _prefix_cache(client: VllmClient) -> tuple[float, float]:
    metrics = client.metrics()
    queries, hits = (
        metrics.get("vllm:prefix_cache_queries_total"),
        metrics.get("vllm:prefix_cache_hits_total"),
    )
    return queries or 0.0, hits or 0.0


def completion_cost(
    client: VllmClient,
    model: str,
    points: Sequence[CompletionPoint],
    sources: dict[str, str],
    window: Callable[[str, str, int], str],
    config: ExecutedEvalConfig,
) -> dict[str, Any]:
    def ask(point: CompletionPoint) -> float:
        text = sources[point.path]
        prefix = "".join(text.splitlines(keepends=True)[: point.line - 1])
        prompt = window(point.path, prefix, config.completion_context_chars)
        request = CompletionRequest(model=model, prompt=prompt, max_tokens=config.completion_max_tokens)
        got = client.completion(request).text
        return score_line(point.expected, first_line(got))[EDIT_SIMILARITY]

    queries, hits = _prefix_cache(client)
    started = time.perf_counter()
    with ThreadPoolExecutor(config.workers) as pool:
        similarity = list(pool.map(ask, points))
    seconds = time.perf_counter() - started
    after_queries, after_hits = _prefix_cache(client)
    asked = after_queries - queries
    return {
        "n": len(points),
        "seconds": round(seconds, 1),
        "prompt_tokens": int(asked),
        "prefix_cache_hit": round((after_hits - hits) / asked, 3) if asked else None,
        "edit_similarity": round(sum(similarity) / len(similarity), 4) if similarity else None,
    }


def answers_cost(
    client: VllmClient, model: str, tasks: DayTasks, config: ExecutedEvalConfig
) -> dict[str, Any]:
    (plan,) = [p for p in plans(tasks, config) if p.name == "anchor"]
    started = time.perf_counter()
    got = plan.answer(client, model, list(range(len(plan.ids))), {})
    seconds = time.perf_counter() - started
    return {
        "n": len(got),
        "seconds": round(seconds, 1),
        "tokens": sum(a.tokens for a in got.values()),
        "passed": int(sum(a.scores.get(PASSED, 0.0) for a in got.values())),
        "finish": {
            r: sum(a.finish_reason == r for a in got.values()) for r in ("stop", "length", "repetition")
        },
        "verdicts": {plan.ids[i]: a.scores.get(PASSED) for i, a in got.items()},
    }


def _speedup(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    return round(before["seconds"] / after["seconds"], 2) if after["seconds"] else None


def run(settings: Settings) -> dict[str, Any]:
    shipped = settings.training.evaluation
    before = shipped.model_copy(update={"workers": 4, "stop_loops": False})
    model = settings.lanes.gpu_lane.served_model_name
    n_points = int(os.environ.get("JUDGE_COST_POINTS", "120"))
    n_anchors = int(os.environ.get("JUDGE_COST_ANCHORS", "40"))
    with empty_data_dir(settings.data_dir), tempfile.TemporaryDirectory(prefix="lanes-judge-cost-") as folder:
        points, sources = package_points(Path(folder), n_points)
        limits = settings.pipeline.cpu_assets.sandbox.model_copy(
            update={"timeout_s": shipped.timeout_s, "runs": 1}
        )
        anchors = load_anchor_set(data_dir(), limits, exclude=[r.name for r in settings.repos.repos])
        tasks = DayTasks(
            repo=[],
            anchor=anchor_subset(anchors.functions, n_anchors),
            problems=[],
            points=[],
            sources={},
            system_prompt=settings.pipeline.dataset.system_prompt,
            limits=limits,
        )
        server = build_server(settings, "gpu", port=0, publish=False)
        server.start()
        try:
            with VllmClient(server.url, timeout_s=900) as client:
                sliding = completion_cost(client, model, points, sources, completion_prompt, shipped)
                grid = completion_cost(client, model, points, sources, grid_prompt, shipped)
                old = answers_cost(client, model, tasks, before)
                new = answers_cost(client, model, tasks, shipped)
        finally:
            server.stop()
    changed = sum(old["verdicts"][k] != new["verdicts"].get(k) for k in old["verdicts"])
    return {
        "completion": {"sliding": sliding, "grid": grid, "speedup": _speedup(sliding, grid)},
        "answers": {
            "before": {k: v for k, v in old.items() if k != "verdicts"} | {"workers": 4, "stop_loops": False},
            "after": {k: v for k, v in new.items() if k != "verdicts"}
            | {"workers": shipped.workers, "stop_loops": shipped.stop_loops},
            "speedup": _speedup(old, new),
            "verdicts_changed": changed,
        },
    }

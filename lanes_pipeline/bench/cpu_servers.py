"""`python -m lanes_pipeline.bench cpu_servers`: the same CPU-lane workload on ik_llama.cpp's llama-server and
on upstream llama.cpp's, side by side in one run.

The workload is the daily `repo_analysis` task as the assets send it: a fixed prefix (instructions, the
output schema, a repository map) and one file per request, the answer a FileAnalysis asked for with the
bounded grammar (cpu_lane/batching/grammar.py). The files are the sample repository's, every version of each
over its days, then a fixture day of small standard-library modules (their first lines) until there are at
least MIN_ANALYSES. Each server gets its own empty data folder, so no answer is remembered from the other
(answers are cached by task, not by server).

Per server: generation and prompt tokens/s (the batch's, over its wall time), prefix-cache reuse (cached
prompt tokens / prompt tokens, by the server's own counts) beside its limit (the share a perfect cache would
serve of the same prompts: each kept answer's prompt's longest common token prefix with one evaluated
before it, its own first try included when an empty answer was asked again or repaired; the batch summary's
`prefix_reuse_limit`), and the analysis parse rate (answers that parse and validate, after the one repair,
over all analyses).
"""

from __future__ import annotations

import dataclasses
import re
import sysconfig
from pathlib import Path
from typing import Any, get_args

from lanes_pipeline.bench.cpu_lane import _sigterm_unwinds
from lanes_pipeline.bench.cpu_yield import empty_data_dir
from lanes_pipeline.cpu_lane.batching.answer_cache import ResponseCache
from lanes_pipeline.cpu_lane.batching.batch import BatchRunner
from lanes_pipeline.cpu_lane.batching.batch_models import BatchConfig, BatchRequest
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.jobs.prompts import PromptLayout
from lanes_pipeline.cpu_lane.jobs.tasks import ANALYSIS, file_prompt
from lanes_pipeline.embedded.servers import build_server
from lanes_pipeline.repos.sample_repo import HERE as SAMPLE_REPO
from lanes_pipeline.repos.sample_repo import HISTORY
from lanes_pipeline.settings import CpuEngineName, Settings, load_settings

MIN_ANALYSES = 20
# The fixture day: small, stable standard-library modules, cut to their first lines (a day's changed files).
FIXTURE_MODULES = (
    "colorsys",
    "bisect",
    "fnmatch",
    "keyword",
    "glob",
    "sched",
    "graphlib",
    "heapq",
    "textwrap",
    "shlex",
    "string",
    "queue",
    "tabnanny",
    "netrc",
    "getopt",
    "stat",
)
FIXTURE_LINES = 70
TARGET_PARSE_RATE = 0.9
_SIGNATURE = re.compile(r"^(?:async\s+)?(?:def|class)\s+\w+[^:]*", re.MULTILINE)


def sample_files() -> list[tuple[str, str]]:
    """(path, source) of every version of each Python file of the sample repository, day by day."""
    seen: set[tuple[str, str]] = set()
    files = []
    for _, _, folder in HISTORY:
        for path in sorted((SAMPLE_REPO / folder).rglob("*.py")):
            entry = (path.relative_to(SAMPLE_REPO / folder).as_posix(), path.read_text(encoding="utf-8"))
            if entry not in seen:
                seen.add(entry)
                files.append(entry)
    return files


def fixture_files(count: int) -> list[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for name in FIXTURE_MODULES[:count]:
        lines = (stdlib / f"{name}.py").read_text(encoding="utf-8").splitlines()[:FIXTURE_LINES]
        files.append((f"fixture/{name}.py", "\n".join(lines) + "\n"))
    return files


def workload_files(minimum: int = MIN_ANALYSES) -> list[tuple[str, str]]:
    files = sample_files()
    return files + fixture_files(max(0, minimum - len(files)))


def repo_map(files: list[tuple[str, str]]) -> str:
    """A repository map like the daily snapshot's: each file with its top-level signatures."""
    lines = []
    for path, source in files:
        signatures = "; ".join(" ".join(m.group(0).split()) for m in _SIGNATURE.finditer(source))
        lines.append(f"{path}: {signatures[:300]}")
    return "\n".join(lines)


def analysis_requests(files: list[tuple[str, str]], max_tokens: int) -> list[BatchRequest]:
    layout = PromptLayout(ANALYSIS, shared_context=repo_map(files))
    return [
        layout.build(f"{i:02d}:{path}", file_prompt(path, source), max_tokens=max_tokens)
        for i, (path, source) in enumerate(files)
    ]


def engine_settings(settings: Settings, engine: CpuEngineName) -> Settings:
    lane = settings.lanes.cpu_lane
    embedded = lane.embedded.model_copy(update={"engine": engine})
    lanes = settings.lanes.model_copy(update={"cpu_lane": lane.model_copy(update={"embedded": embedded})})
    return dataclasses.replace(settings, lanes=lanes)


def measure(settings: Settings, engine: CpuEngineName, requests: list[BatchRequest]) -> dict[str, Any]:
    """One engine in its own empty data folder: start its server, run the analyses, read the figures."""
    with empty_data_dir(settings.data_dir) as root:
        fresh = engine_settings(load_settings(settings.config_dir), engine)
        lane = fresh.lanes.cpu_lane
        server = build_server(fresh, "cpu", port=0, publish=False)
        try:
            server.start()
            with (
                CpuClient(server.url, lane.api_key(), timeout_s=lane.request_timeout_s, seed=0) as client,
                ResponseCache(root / "cache.sqlite3") as cache,
            ):
                info = client.server_info(lane.model)
                config = BatchConfig.of(
                    lane,
                    max_slots=max(1, min(lane.max_slots, info.total_slots)),
                    overflow="shrink",  # a long file is cut to fit the slot, as the assets would
                )
                result = BatchRunner(client, cache, config).run(requests)
        finally:
            server.stop()
    summary = result.summary
    parsed = [r for r in result.results if r.status == "ok" and r.parsed is not None]
    failures: dict[str, int] = {}
    for item in result.results:
        if item.failure is not None:
            failures[item.failure.kind] = failures.get(item.failure.kind, 0) + 1
    return {
        "server": engine,
        "generation_tok_s": round(summary.generation_tokens_per_s, 1),
        "prompt_tok_s": round(summary.prompt_tokens_per_s, 1),
        "prefix_reuse": round(summary.prefix_cache_reuse or 0.0, 4),
        "prefix_reuse_limit": round(summary.prefix_reuse_limit or 0.0, 4),
        "analysis_parse_rate": round(len(parsed) / len(requests), 4) if requests else 0.0,
        "analyses": len(requests),
        "parsed": len(parsed),
        "parsed_first_try": sum(not r.repaired for r in parsed),
        "truncated": sum(bool(r.metrics and r.metrics.truncated) for r in result.results),
        "failures": failures,
        "failure_reasons": [f"{r.id}: {r.failure.reason[:200]}" for r in result.results if r.failure][:5],
        "server_header": info.server,
        "prompt_tokens": summary.prompt_tokens,
        "completion_tokens": summary.completion_tokens,
        "requests_sent": summary.requests_sent,
        "wall_s": summary.wall_s,
    }


def targets(servers: list[dict[str, Any]]) -> dict[str, Any]:
    rates = {s["server"]: s["analysis_parse_rate"] for s in servers}
    ik, upstream = rates.get("ik_llama"), rates.get("llama_cpp")
    return {
        "ik_parse_rate_at_least": TARGET_PARSE_RATE,
        "ik_parse_rate_met": ik is not None and ik >= TARGET_PARSE_RATE,
        "ik_not_below_upstream": ik is not None and upstream is not None and ik >= upstream,
    }


def markdown(out: dict[str, Any]) -> str:
    lines = [
        f"The same {out['analyses']} file analyses (the sample repository's days, then a fixture day) on "
        f"each embedded CPU server, each in its own data folder; max_tokens {out['max_tokens']}.",
        "",
        "| server | generation tok/s | prompt tok/s | prefix reuse | reuse limit | analysis parse rate |",
        "|---|---|---|---|---|---|",
    ]
    for s in out["servers"]:
        lines.append(
            f"| {s['server']} | {s['generation_tok_s']} | {s['prompt_tok_s']} | {s['prefix_reuse']:.1%} "
            f"| {s['prefix_reuse_limit']:.1%} "
            f"| {s['analysis_parse_rate']:.0%} ({s['parsed']}/{s['analyses']}) |"
        )
    t = out["targets"]
    lines += [
        "",
        f"ik parse rate >= {t['ik_parse_rate_at_least']}: {'met' if t['ik_parse_rate_met'] else 'MISSED'}; "
        f"ik not below upstream: {'met' if t['ik_not_below_upstream'] else 'MISSED'}.",
    ]
    return "\n".join(lines)


def run(settings: Settings) -> dict[str, Any]:
    max_tokens = settings.pipeline.cpu_assets.analysis_max_tokens
    files = workload_files()
    requests = analysis_requests(files, max_tokens)
    servers = []
    with _sigterm_unwinds():
        for engine in get_args(CpuEngineName):
            print(f"[bench] cpu_servers: {engine}, {len(requests)} analyses", flush=True)
            servers.append(measure(settings, engine, requests))
    out: dict[str, Any] = {
        "analyses": len(requests),
        "max_tokens": max_tokens,
        "servers": servers,
        "targets": targets(servers),
    }
    out["markdown"] = markdown(out)
    return out

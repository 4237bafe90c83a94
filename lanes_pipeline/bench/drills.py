"""`python -m lanes_pipeline.bench drills`: fault drills, counted (issue 14, item 8).

Each drill does something that happens to a real installation and counts what it cost:

- `cpu_server_kills`: a 50-request CPU-lane batch through CpuLaneResource (its answer cache, as the assets
  use it) while the real embedded llama-server is SIGKILLed 3 times; after each kill the server is started
  again and the batch re-run, as a day's retry would. `lost`: committed answers missing (or changed)
  afterwards; `re_asked`: completion requests for items whose answer was already committed when sent (the
  client's per-item count, checked against the cache at send time); requests in flight at a kill are
  counted apart (they are expected to be asked again).
- `training_kill`, `alias_move_kill`: the run SIGKILLed during training and at points inside an alias move
  (drills_gpu.py): `half_adapters` (folders a loader would see without a complete adapter) and whether the
  registry is consistent (with itself, the folders and what vLLM serves under the alias).
- `vllm_restart_after_promotion`: vLLM stopped and started again after a promotion; seconds until the alias
  answers again through the restore the adapters sensor runs.
- `concurrent_runs`: two in-process runs of the same partition of CPU-lane assets at once (drills_cpu.py):
  identical artifacts, answer cache and memo uncorrupted.
- `disk_full`: a dataset written the way lora_dataset writes it onto a filesystem that fills up
  (drills_disk.py): a clear error, the previous partitions intact.

This module holds the pure parts (counting, targets, the report); the drills themselves are in the
drills_* modules. A drill that fails is reported with its error and misses its targets; the others run.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from lanes_pipeline.settings import Settings

GPU_DRILLS = ("training_kill", "alias_move_kill", "vllm_restart_after_promotion")
TARGETS = {"lost": 0, "re_asked": 0, "half_adapters": 0, "identical": True}


class Send(BaseModel):
    """One completion request the client sent for an item during the kill drill."""

    item: str
    run: int
    committed_before: bool  # the item's answer was in the answer cache when this request was sent
    in_flight_at_kill: bool = False  # the server was killed while this request was open
    answered: bool = False


class KillCounts(BaseModel):
    items: int
    kills: int
    runs: int
    sends: int
    committed_before_last_kill: int
    lost: int
    lost_items: list[str]
    re_asked: int
    re_asked_items: list[str]
    in_flight_at_kill: int
    in_flight_asked_again: int
    unanswered_at_end: int


def kill_counts(
    items: Sequence[str],
    sends: Sequence[Send],
    committed: Sequence[dict[str, str]],
    final: dict[str, str],
    kills: int,
) -> KillCounts:
    """The counts of the kill drill. `committed`: the answer cache (item -> text) after each run, in order;
    `final`: the cache at the end. An answer committed once and then missing or different is lost."""
    first: dict[str, str] = {}
    for snapshot in committed:
        for item, text in snapshot.items():
            first.setdefault(item, text)
    lost = sorted(item for item, text in first.items() if final.get(item) != text)
    re_asked = [s for s in sends if s.committed_before]
    flying = [s for s in sends if s.in_flight_at_kill]
    asked_again = {
        s.item
        for s in flying
        if any(o.item == s.item and o.run > s.run and not o.in_flight_at_kill for o in sends)
    }
    before_last = committed[kills - 1] if 0 < kills <= len(committed) else {}
    return KillCounts(
        items=len(items),
        kills=kills,
        runs=len(committed),
        sends=len(sends),
        committed_before_last_kill=len(before_last),
        lost=len(lost),
        lost_items=lost,
        re_asked=len(re_asked),
        re_asked_items=sorted({s.item for s in re_asked}),
        in_flight_at_kill=len(flying),
        in_flight_asked_again=len(asked_again),
        unanswered_at_end=sum(item not in final for item in items),
    )


def half_adapter_reason(names: set[str], config_ok: bool, weights_ok: bool) -> str | None:
    """Why a visible adapter folder is not a complete adapter (None: it is one). `names`: its files."""
    missing = [
        n
        for n, ok in (("adapter_config.json", config_ok), ("adapter_model.safetensors", weights_ok))
        if not ok
    ]
    if missing:
        return f"missing or unreadable: {', '.join(missing)}"
    if not names:
        return "empty"
    return None


def _met(value: Any, target: Any) -> dict[str, Any]:
    return {"value": value, "target": target, "met": value is not None and value == target}


def targets(drills: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Issue 14's targets over the drills' figures; a drill that did not run gives None, never a met."""
    kills = drills.get("cpu_server_kills", {})
    halves = [drills.get(name, {}).get("half_adapters") for name in ("training_kill", "alias_move_kill")]
    half = None if any(h is None for h in halves) else sum(halves)  # type: ignore[arg-type]
    return {
        "lost": _met(kills.get("lost"), TARGETS["lost"]),
        "re_asked": _met(kills.get("re_asked"), TARGETS["re_asked"]),
        "half_adapters": _met(half, TARGETS["half_adapters"]),
        "identical": _met(drills.get("concurrent_runs", {}).get("identical"), TARGETS["identical"]),
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return "n/a" if value is None else str(value)


DRILL_FIGURES = {
    "cpu_server_kills": ("kills", "lost", "re_asked", "in_flight_at_kill", "in_flight_asked_again"),
    "training_kill": ("half_adapters", "registry_consistent", "stale_staging_removed_next_run"),
    "alias_move_kill": (
        "half_adapters",
        "registry_consistent",
        "served_matches_registry_after_kill",
        "consistent_after_restore",
    ),
    "vllm_restart_after_promotion": ("seconds_until_alias_served", "vllm_start_s", "restore_s"),
    "concurrent_runs": (
        "identical",
        "both_succeeded",
        "cache_integrity",
        "memo_unreadable",
        "answers_done_twice",
    ),
    "disk_full": ("filesystem", "clear_error", "previous_partitions_intact", "staging_left"),
}


def markdown(out: dict[str, Any]) -> str:
    lines = ["| drill | what was done | counted |", "|---|---|---|"]
    for name, figures in DRILL_FIGURES.items():
        drill = out["drills"].get(name, {})
        counted = ", ".join(f"{key} {_cell(drill.get(key))}" for key in figures)
        if drill.get("error"):
            counted = f"FAILED: {drill['error'][:200]}"
        lines.append(f"| {name} | {drill.get('done', '')} | {counted} |")
    lines += [
        "",
        "Targets: "
        + "; ".join(
            f"{name} = {_cell(t['value'])} (target {_cell(t['target'])}): {'met' if t['met'] else 'MISSED'}"
            for name, t in out["targets"].items()
        ),
    ]
    return "\n".join(lines)


def guarded(name: str, drill: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one drill; an error is its result (named, with the last frames), and the next drill runs."""
    print(f"[bench] drills: {name}", flush=True)
    try:
        return drill()
    except Exception as exc:  # a drill that breaks is a finding, reported in its row
        frames = traceback.format_exception(exc)[-3:]
        return {"error": f"{type(exc).__name__}: {exc}", "trace": "".join(frames)[-2000:]}


def run(settings: Settings) -> dict[str, Any]:
    from lanes_pipeline.bench import drills_cpu, drills_disk, drills_gpu
    from lanes_pipeline.bench.cpu_lane import _sigterm_unwinds

    drills: dict[str, dict[str, Any]] = {}
    with _sigterm_unwinds():
        drills["cpu_server_kills"] = guarded("cpu_server_kills", lambda: drills_cpu.server_kills(settings))
        drills["concurrent_runs"] = guarded("concurrent_runs", lambda: drills_cpu.concurrent_runs(settings))
        drills["disk_full"] = guarded("disk_full", drills_disk.disk_full)
        # Their setup (adapters, vLLM's start) failing fails each of them, with its error; the rest stands.
        gpu = guarded("gpu_lane setup", lambda: drills_gpu.run_all(settings, guarded))
        drills |= dict.fromkeys(GPU_DRILLS, gpu) if "error" in gpu else gpu
    out: dict[str, Any] = {"drills": drills, "targets": targets(drills)}
    out["markdown"] = markdown(out)
    return out

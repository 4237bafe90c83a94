"""The learning benchmark's pure parts: figures and targets from the days' points, lever variants."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from lanes_pipeline.bench.learning import summarize, targets, variant_configs
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.promotion import Figures, LearningPoint
from lanes_pipeline.settings import default_config_dir, load_settings


def test_targets_compare_served_with_base_as_the_issue_defines_them() -> None:
    base = {"eval_loss": 2.0, "repo_pass_rate": 0.10, "humaneval_pass1": 0.05}
    met = targets(base, {"eval_loss": 1.5, "repo_pass_rate": 0.20, "humaneval_pass1": 0.04})
    assert all(t["met"] for t in met.values()), met
    missed = targets(base, {"eval_loss": 1.7, "repo_pass_rate": 0.15, "humaneval_pass1": 0.03})
    assert missed["eval_loss_at_most_0.8x_base"] == {"value": 1.7, "target": 1.6, "met": False, "gap": 0.1}
    assert missed["repo_pass_rate_at_least_base_plus_10_points"]["gap"] == 0.05
    assert missed["humaneval_pass1_at_least_base_minus_1_point"]["gap"] == 0.01
    unmeasured = targets(
        base | {"eval_loss": None}, {"eval_loss": None, "repo_pass_rate": 0, "humaneval_pass1": 0}
    )
    assert unmeasured["eval_loss_at_most_0.8x_base"]["met"] is False


def test_summary_reads_the_last_judged_day_and_counts_decisions(tmp_path: Path) -> None:
    registry = AdapterRegistry(tmp_path / "registry.sqlite")
    points = [
        LearningPoint(day=date(2026, 11, 1), served="base", note="no training rows"),
        LearningPoint(
            day=date(2026, 11, 2),
            served="lanes-2026-11-02",
            candidate="lanes-2026-11-02",
            promoted=True,
            base=Figures(eval_loss=2.0, repo_pass_rate=0.1),
            served_figures=Figures(eval_loss=1.0, repo_pass_rate=0.2),
        ),
        LearningPoint(day=date(2026, 11, 3), served="lanes-2026-11-02", note="no training rows"),
    ]
    out = summarize(points, registry, {"base": 0.0, "served": 0.0})
    assert out["days"] == ["2026-11-01", "2026-11-02", "2026-11-03"]
    assert out["served_version"] == "lanes-2026-11-02"
    assert out["base"] == {"repo_pass_rate": 0.1, "eval_loss": 2.0, "humaneval_pass1": 0.0}
    assert out["served"] == {"repo_pass_rate": 0.2, "eval_loss": 1.0, "humaneval_pass1": 0.0}
    assert out["promotions"] == 0 and out["rejections"] == 0  # the registry is empty here
    assert out["targets"]["repo_pass_rate_at_least_base_plus_10_points"]["met"] is True


def test_a_variant_changes_one_lever_in_a_copy_of_the_configs(tmp_path: Path) -> None:
    folder = variant_configs(default_config_dir(), {"training": {"lora": {"r": 16}}}, tmp_path / "configs")
    changed, shipped = load_settings(folder).training, load_settings(default_config_dir()).training
    assert changed.lora.r == 16
    assert changed.model_copy(update={"lora": shipped.lora}) == shipped  # the rest stays
    assert changed.lora.model_copy(update={"r": shipped.lora.r}) == shipped.lora
    assert load_settings(default_config_dir()).training.lora.r == 8  # the shipped configs are untouched

"""The learning benchmark's variants and judges (bench/learning_variants.py): the configs that take each
lever away, the judge a run is sized for, and a variant's candidate read against the default's."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanes_pipeline.bench.learning import budget_configs
from lanes_pipeline.bench.learning_variants import (
    JUDGES,
    LEVERS,
    against_default,
    judge_line,
    lever_configs,
    variant_configs,
    variant_row,
    variants_markdown,
    wanted_judge,
    wanted_variants,
)
from lanes_pipeline.settings import default_config_dir, load_settings


def test_a_variant_changes_one_lever_in_a_copy_of_the_configs(tmp_path: Path) -> None:
    folder = variant_configs(default_config_dir(), {"training": {"lora": {"r": 16}}}, tmp_path / "configs")
    changed, shipped = load_settings(folder).training, load_settings(default_config_dir()).training
    assert changed.lora.r == 16
    assert changed.model_copy(update={"lora": shipped.lora}) == shipped  # the rest stays
    assert changed.lora.model_copy(update={"r": shipped.lora.r}) == shipped.lora
    assert load_settings(default_config_dir()).training.lora.r == 8  # the shipped configs are untouched


def test_each_lever_variant_takes_one_lever_away_under_its_own_adapter_names(tmp_path: Path) -> None:
    run = budget_configs(default_config_dir(), tmp_path / "run")
    default = load_settings(run)
    assert default.pipeline.cpu_assets.body_samples > 0 and default.pipeline.dataset.completion_cuts > 0
    assert default.pipeline.dataset.replay_functions > 0 and default.training.max_steps is None
    taken = {
        "no_verified_bodies": lambda s: s.pipeline.cpu_assets.body_samples == 0,
        "no_completion_rows": lambda s: s.pipeline.dataset.completion_cuts == 0,
        "no_replay": lambda s: s.pipeline.dataset.replay_functions == 0,
        "old_recipe": lambda s: (
            (s.training.max_steps, s.training.learning_rate, s.training.checkpoints) == (30, 2e-4, 1)
        ),
        "from_current": lambda s: s.training.start_from == "current",
    }
    assert set(taken) == set(LEVERS)
    for name, lever_away in taken.items():
        variant = load_settings(lever_configs(run, name, tmp_path / name))
        assert lever_away(variant) and not lever_away(default), name
        # its own adapters beside the default run's on the same vLLM; the CPU budget and the judge stay
        assert variant.lanes.gpu_lane.alias_name == f"{name.replace('_', '-')}-current"
        assert variant.pipeline.cpu_assets.backlog_per_day == default.pipeline.cpu_assets.backlog_per_day
        assert variant.training.evaluation == default.training.evaluation


def test_the_variants_and_the_judge_asked_for() -> None:
    assert wanted_variants(None) == list(LEVERS)
    assert wanted_variants("none") == []
    assert wanted_variants("no_replay, shipped_budget") == ["no_replay", "shipped_budget"]
    with pytest.raises(ValueError, match=r"LANES_LEARNING_VARIANTS: unknown \['no_such'\]"):
        wanted_variants("no_replay,no_such")
    assert wanted_judge(None) == "full" and wanted_judge(" daily ") == "daily"
    assert set(JUDGES) == {"full", "daily"}
    with pytest.raises(ValueError, match="LANES_LEARNING_JUDGE: unknown 'small'; known: full, daily"):
        wanted_judge("small")
    assert judge_line("full", 160, None).startswith(
        "Judge `full` (LANES_LEARNING_JUDGE): 160 anchor tasks, all 164"
    )
    assert "24 anchor tasks, 24 HumanEval problems" in judge_line("daily", 24, 24)
    row = variant_row("no_replay", LEVERS["no_replay"], {"promotions": 1, "served": {"a": 1}, "curve": []})
    assert row == {"name": "no_replay", "changed": LEVERS["no_replay"], "promotions": 1, "served": {"a": 1}}


def exact(matched: range, n: int = 20) -> dict[str, dict[str, float]]:
    """A candidate's completion scores: exact match on the points in `matched`."""
    return {"completion_exact_match": {f"p{i}": float(i in matched) for i in range(n)}}


def test_a_variants_candidate_is_paired_against_the_default_runs_candidate_on_every_figure() -> None:
    default = {"base": exact(range(2)), "candidate": exact(range(8))}
    # taking the lever away lost six of the default's eight matches and won none
    variant = {"base": exact(range(2)), "candidate": exact(range(2))}
    paired = {c.figure: c for c in against_default(variant, default)}
    moved = paired["completion_exact_match"]
    assert (moved.against, moved.n, moved.wins, moved.losses, moved.difference) == ("default", 20, 0, 6, -0.3)
    assert moved.p_worse == pytest.approx(1 / 64) and moved.p_better == 1.0
    assert paired["repo_pass_rate"].n == 0  # neither answered it: an empty comparison
    # a day with no candidate on either side has nothing to pair
    assert against_default({"base": exact(range(2))}, default) == []
    assert against_default(variant, {"base": exact(range(2))}) == []


def test_the_variants_table_shows_each_levers_move_with_its_sample_size_and_p_values() -> None:
    default = {"promotions": 1, "candidate": {"completion_exact_match": 0.4, "eval_loss": 1.2}}
    paired = {
        c.figure: c.model_dump()
        for c in against_default({"candidate": exact(range(2))}, {"candidate": exact(range(8))})
    }
    rows = [
        {
            "name": "no_completion_rows",
            "promotions": 0,
            "candidate": {"completion_exact_match": 0.1, "eval_loss": 1.3},
            "against_default": paired,
        }
    ]
    lines = variants_markdown(rows, default).splitlines()
    assert lines[2].startswith("| variant | promotions | completion_edit_similarity | completion_exact_match")
    assert lines[4] == "| default | 1 | - | 0.4000 | - | - | - | 1.2000 |"
    assert lines[5] == (
        "| no_completion_rows | 0 | - | 0.1000 (-0.3000, n 20, p 1 / 0.016) | - | - | - | 1.3000 |"
    )
    assert variants_markdown([], default) == ""

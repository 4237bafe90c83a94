"""How the GPU-lane assets are declared when the definitions load: the freshness policy of served_adapter,
the GPU-lane asset checks; and the rule of the figures check. Fast: nothing runs."""

from __future__ import annotations

from dagster import AssetKey

from lanes_pipeline.definitions import build_definitions
from lanes_pipeline.gpu_lane.assets import SERVED_FRESHNESS
from lanes_pipeline.gpu_lane.checks import missing_figures, rule_disagrees
from lanes_pipeline.settings import Settings, TrainingConfig


def test_served_adapter_has_a_freshness_policy_and_the_gpu_assets_have_checks(settings: Settings) -> None:
    defs = build_definitions(settings)
    served = defs.resolve_assets_def("served_adapter")
    assert served.specs_by_key[AssetKey("served_adapter")].freshness_policy == SERVED_FRESHNESS
    checks = {key.name for key in defs.resolve_asset_graph().asset_check_keys}
    assert {"adapter_evaluation_has_every_figure", "served_alias_is_loaded"} <= checks


def test_the_figures_check_names_each_missing_figure() -> None:
    full = {"eval_loss": 1.0, "repo_pass_rate": 0.5, "humaneval_pass1": 0.05}
    judged = {"current": None, "figures": {"base": full, "candidate": full}}
    assert missing_figures(judged) == []
    against_current = {
        "current": "lanes-2026-11-04",
        "figures": {"base": full, "candidate": {"eval_loss": 0.9, "repo_pass_rate": 0.5}},
    }
    assert missing_figures(against_current) == [
        "candidate.humaneval_pass1",
        "current.eval_loss",
        "current.repo_pass_rate",
        "current.humaneval_pass1",
    ]
    # a day with too few held-out rows records why: its eval loss is not missing, the rest is
    assert missing_figures({"current": None, "figures": {}, "unjudged": "too few rows"}) == [
        "base.repo_pass_rate",
        "base.humaneval_pass1",
        "candidate.repo_pass_rate",
        "candidate.humaneval_pass1",
    ]


def test_the_limits_check_applies_the_rule_again_to_the_recorded_figures() -> None:
    config = TrainingConfig()
    inside = {
        "base": {"eval_loss": 2.0, "repo_pass_rate": 0.1, "humaneval_pass1": 0.05},
        "candidate": {"eval_loss": 1.0, "repo_pass_rate": 0.2, "humaneval_pass1": 0.05},
    }
    assert rule_disagrees({"figures": inside}, config) == []
    forgot = inside | {"candidate": inside["candidate"] | {"humaneval_pass1": 0.0}}
    assert any("below the base's" in r for r in rule_disagrees({"figures": forgot}, config))
    assert rule_disagrees({"figures": {}}, config) == ["no figures recorded"]

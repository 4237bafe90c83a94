"""How the GPU-lane assets are declared when the definitions load: the freshness policy of served_adapter,
the GPU-lane asset checks; and the rule of the figures check. Fast: nothing runs."""

from __future__ import annotations

from dagster import AssetKey

from lanes_pipeline.definitions import build_definitions
from lanes_pipeline.gpu_lane.assets import SERVED_FRESHNESS
from lanes_pipeline.gpu_lane.checks import missing_figures
from lanes_pipeline.settings import Settings


def test_served_adapter_has_a_freshness_policy_and_the_gpu_assets_have_checks(settings: Settings) -> None:
    defs = build_definitions(settings)
    served = defs.resolve_assets_def("served_adapter")
    assert served.specs_by_key[AssetKey("served_adapter")].freshness_policy == SERVED_FRESHNESS
    checks = {key.name for key in defs.resolve_asset_graph().asset_check_keys}
    assert {"adapter_evaluation_has_every_figure", "served_alias_is_loaded"} <= checks


def test_the_figures_check_names_each_missing_figure() -> None:
    full = {"eval_loss": 1.0, "task_score": 0.5}
    judged = {"current": None, "figures": {"base": full, "candidate": full}}
    assert missing_figures(judged) == []
    against_current = {
        "current": "lanes-2026-11-04",
        "figures": {"base": full, "candidate": {"eval_loss": 0.9}},
    }
    assert missing_figures(against_current) == [
        "candidate.task_score",
        "current.eval_loss",
        "current.task_score",
    ]
    assert missing_figures({"current": None, "figures": {}, "unjudged": "too few rows"}) == [
        "base.eval_loss",
        "base.task_score",
        "candidate.eval_loss",
        "candidate.task_score",
    ]

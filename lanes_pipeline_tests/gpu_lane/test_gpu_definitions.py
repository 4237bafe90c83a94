"""How the GPU-lane assets are declared when the definitions load: the freshness policy of served_adapter,
the GPU-lane asset checks; and the rule of the figures check. Fast: nothing runs."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from dagster import AssetKey

from lanes_pipeline.definitions import build_definitions
from lanes_pipeline.gpu_lane.assets import SERVED_FRESHNESS
from lanes_pipeline.gpu_lane.checks import missing_figures, rule_disagrees
from lanes_pipeline.gpu_lane.evaluation_record import ANSWERS_FILE, DayAnswers, ModelAnswers
from lanes_pipeline.gpu_lane.judged import EDIT_SIMILARITY, PASSED, TaskAnswer
from lanes_pipeline.settings import Settings, TrainingConfig
from lanes_pipeline.store import ArtifactStore


def test_served_adapter_has_a_freshness_policy_and_the_gpu_assets_have_checks(settings: Settings) -> None:
    defs = build_definitions(settings)
    served = defs.resolve_assets_def("served_adapter")
    assert served.specs_by_key[AssetKey("served_adapter")].freshness_policy == SERVED_FRESHNESS
    checks = {key.name for key in defs.resolve_asset_graph().asset_check_keys}
    assert {"adapter_evaluation_has_every_figure", "served_alias_is_loaded"} <= checks


def test_the_figures_check_names_each_model_without_the_primary_figure() -> None:
    full = {"completion_edit_similarity": 0.4, "repo_pass_rate": 0.5}
    judged = {"current": None, "figures": {"base": full, "candidate": full}}
    assert missing_figures(judged, "completion_edit_similarity") == []
    against_current = {
        "current": "lanes-2026-11-04",
        "figures": {"base": full, "candidate": {"repo_pass_rate": 0.5}},
    }
    assert missing_figures(against_current, "completion_edit_similarity") == [
        "candidate.completion_edit_similarity",
        "current.completion_edit_similarity",
    ]
    assert missing_figures({"current": None, "figures": {}}, "eval_loss") == [
        "base.eval_loss",
        "candidate.eval_loss",
    ]


def _record(store: ArtifactStore, candidate_similarity: float, anchor_passed: int) -> None:
    """A judged day's answers.json: 12 completion points and 50 anchor tasks for base and candidate."""

    def answers(similarity: float, passed: int) -> dict[str, list[TaskAnswer]]:
        points = [
            TaskAnswer(
                task=f"p{i}", answer="x", scores={EDIT_SIMILARITY: similarity, "exact_match": 0.0}, reason=""
            )
            for i in range(12)
        ]
        anchors = [
            TaskAnswer(task=f"a{i}", answer="y", scores={PASSED: float(i < passed)}, reason="")
            for i in range(50)
        ]
        return {"completion": points, "anchor": anchors}

    record = DayAnswers(
        day=date(2026, 11, 4),
        candidate="c",
        labels={
            "base": ModelAnswers(model="base", task_sets=answers(0.3, 10)),
            "candidate": ModelAnswers(model="c", task_sets=answers(candidate_similarity, anchor_passed)),
        },
    )
    store.write_json("adapter_evaluation", "2026-11-04", ANSWERS_FILE, record.model_dump(mode="json"))


def test_the_limits_check_applies_the_rule_again_to_the_recorded_answers(tmp_path: Path) -> None:
    config, store = TrainingConfig(), ArtifactStore(tmp_path)
    _record(store, candidate_similarity=0.5, anchor_passed=10)
    assert rule_disagrees(store, "2026-11-04", config) == []
    _record(store, candidate_similarity=0.5, anchor_passed=5)  # 10 points of the anchor set forgotten
    assert any(
        "anchor_pass_rate vs base" in r and "worse beyond" in r
        for r in rule_disagrees(store, "2026-11-04", config)
    )
    _record(store, candidate_similarity=0.3, anchor_passed=10)  # no better
    assert any("not shown better" in r for r in rule_disagrees(store, "2026-11-04", config))
    assert "no candidate was judged on 2026-11-05" in rule_disagrees(store, "2026-11-05", config)[0]

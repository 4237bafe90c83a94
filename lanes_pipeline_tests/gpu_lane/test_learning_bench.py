"""The learning benchmark's pure parts: figures and targets from the days' points, lever variants."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import pytest

from lanes_pipeline.bench import learning
from lanes_pipeline.bench.learning import (
    CPU_BUDGET,
    _served_vs_base,
    bench_days,
    budget_configs,
    progress_writer,
    summarize,
    summary_markdown,
)
from lanes_pipeline.bench.learning_targets import targets
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.evaluation_record import (
    ANSWERS_FILE,
    EVALUATION_ASSET,
    DayAnswers,
    ModelAnswers,
)
from lanes_pipeline.gpu_lane.judged import EDIT_SIMILARITY, EXACT_MATCH, TaskAnswer
from lanes_pipeline.gpu_lane.paired import compare
from lanes_pipeline.gpu_lane.promotion import Figures, LearningPoint, paired_decision
from lanes_pipeline.settings import default_config_dir, load_settings
from lanes_pipeline.steps import STOP_REQUESTED
from lanes_pipeline.store import ArtifactStore


def test_targets_compare_served_with_base_as_the_issue_defines_them() -> None:
    base = {"eval_loss": 2.0, "repo_pass_rate": 0.10, "humaneval_pass1": 0.05}
    met = targets(base, {"eval_loss": 1.5, "repo_pass_rate": 0.20, "humaneval_pass1": 0.04})
    judge_issue = ("eval_loss_at_most_0.8x_base", "repo_pass_rate_at_least_base_plus_10_points")
    assert all(met[name]["met"] for name in [*judge_issue, "humaneval_pass1_at_least_base_minus_1_point"])
    missed = targets(base, {"eval_loss": 1.7, "repo_pass_rate": 0.15, "humaneval_pass1": 0.03})
    assert missed["eval_loss_at_most_0.8x_base"] == {"value": 1.7, "target": 1.6, "met": False, "gap": 0.1}
    assert missed["repo_pass_rate_at_least_base_plus_10_points"]["gap"] == 0.05
    assert missed["humaneval_pass1_at_least_base_minus_1_point"]["gap"] == 0.01
    unmeasured = targets(
        base | {"eval_loss": None}, {"eval_loss": None, "repo_pass_rate": 0, "humaneval_pass1": 0}
    )
    assert unmeasured["eval_loss_at_most_0.8x_base"]["met"] is False


def exact_matches(won: int, lost: int, n: int = 440) -> dict:
    """served against base on exact match: `won` points only served matched, `lost` only base did."""
    served = {f"p{i}": 1.0 if i < won else 0.0 for i in range(n)}
    base = {f"p{i}": 1.0 if won <= i < won + lost else 0.0 for i in range(n)}
    return compare("completion_exact_match", "base", served, base, "pass_fail").model_dump()


def test_the_training_issues_targets_read_the_paired_comparisons_of_served_against_base() -> None:
    base = {"eval_loss": 2.0, "repo_pass_rate": 0.1, "humaneval_pass1": 0.05, "completion_exact_match": 0.08}
    served = {"eval_loss": 1.9, "repo_pass_rate": 0.1, "humaneval_pass1": 0.05, "completion_exact_match": 0.1}
    worse_repo = compare(
        "repo_pass_rate",
        "base",
        {f"t{i}": 0.0 for i in range(10)},
        {f"t{i}": 1.0 for i in range(10)},
        "pass_fail",
    ).model_dump()
    paired = {"completion_exact_match": exact_matches(6, 0), "repo_pass_rate": worse_repo}
    out = targets(base, served, paired, promotions=1)
    exact = out["completion_exact_match_better_p_below_0.05"]
    assert exact["met"] is True and exact["p_value"] == pytest.approx(1 / 64) and exact["n"] == 440
    assert out["completion_exact_match_at_least_base_plus_5_points"] == {
        "value": 0.1,
        "target": 0.13,
        "met": False,
        "gap": 0.03,
    }
    assert out["at_least_one_promotion"]["met"] is True
    assert out["repo_pass_rate_not_significantly_lower"]["met"] is False  # 10 lost, p worse ~0.001
    assert out["anchor_pass_rate_not_significantly_lower"]["met"] is True  # not measured: nothing lost
    # unmeasured: nothing to pair is not better; six wins against five losses is not significant
    assert out["completion_edit_similarity_better_p_below_0.05"] == {
        "difference": None,
        "p_value": None,
        "n": 0,
        "met": False,
    }
    even = targets(base, served, {"completion_exact_match": exact_matches(6, 5)}, promotions=0)
    assert even["completion_exact_match_better_p_below_0.05"]["met"] is False
    assert even["at_least_one_promotion"]["met"] is False


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
            candidate_figures=Figures(eval_loss=1.0, repo_pass_rate=0.2, completion_exact_match=0.5),
            evaluation_s=512.5,
            requests=900,
        ),
        LearningPoint(day=date(2026, 11, 3), served="lanes-2026-11-02", note="no training rows"),
    ]
    decision = paired_decision(
        {
            "base": {"completion_edit_similarity": {f"p{i}": 0.2 for i in range(8)}},
            "candidate": {"completion_edit_similarity": {f"p{i}": 0.5 for i in range(8)}},
        },
        "completion_edit_similarity",
        0.05,
        {},
    )
    exact = compare(
        "completion_exact_match", "base", {"p0": 1.0, "p1": 0.0}, {"p0": 0.0, "p1": 0.0}, "pass_fail"
    )
    unmeasured = compare("eval_loss", "base", {}, {}, "graded")
    out = summarize(points, registry, {"2026-11-02": decision}, [exact, unmeasured])
    assert [d["day"] for d in out["days"]] == ["2026-11-01", "2026-11-02", "2026-11-03"]
    assert out["days"][0]["decision"] == "no adapter" and out["days"][0]["p_value"] is None
    judged = out["days"][1]
    assert (judged["decision"], judged["primary_figure"]) == ("promote", "completion_edit_similarity")
    assert (judged["wins"], judged["losses"], judged["ties"], judged["against"]) == (8, 0, 0, "base")
    assert judged["p_value"] == pytest.approx(1 / 256)
    assert (judged["evaluation_s"], judged["requests"]) == (512.5, 900)
    assert out["served_version"] == "lanes-2026-11-02"
    keys = {"repo_pass_rate", "eval_loss", "humaneval_pass1", "anchor_pass_rate", "completion_exact_match"}
    assert keys | {"completion_edit_similarity"} <= set(out["base"])
    assert (out["base"]["repo_pass_rate"], out["base"]["eval_loss"], out["base"]["humaneval_pass1"]) == (
        0.1,
        2.0,
        None,  # not measured that day
    )
    assert (out["served"]["repo_pass_rate"], out["served"]["eval_loss"]) == (0.2, 1.0)
    assert out["candidate"]["completion_exact_match"] == 0.5 and set(out["candidate"]) == set(out["base"])
    assert out["tasks"] == {"repo": 0, "anchor": 0, "completion_points": 0, "humaneval": 0}
    assert out["promotions"] == 0 and out["rejections"] == 0  # the registry is empty here
    assert out["targets"]["repo_pass_rate_at_least_base_plus_10_points"]["met"] is True
    lines = summary_markdown(out, 3).splitlines()
    assert lines[:2] == [
        "Days run: 3 of the sample's 3; promotions 0, rejections 0; the alias serves lanes-2026-11-02.",
        "Task sets of the last judged day (n): repo 0, anchor 0, completion_points 0, humaneval 0.",
    ]
    assert lines[2:5] == [
        "- 2026-11-01: no adapter",
        "- 2026-11-02: promote; completion_edit_similarity against base on 8 paired tasks: 8 won, 0 lost, "
        "0 tied, difference +0.3000 (95% interval +0.3000 to +0.3000), one-sided p = 0.004",
        "- 2026-11-03: no adapter",
    ]
    assert out["served_vs_base"]["completion_exact_match"]["wins"] == 1
    assert out["targets"]["completion_exact_match_better_p_below_0.05"]["p_value"] == 0.5
    assert lines[5:] == [
        "",
        "Served (lanes-2026-11-02) against base on the last judged day, every figure:",
        "- completion_exact_match: 0.5000 vs 0.0000 on 2 paired tasks, 1 won, 0 lost, difference +0.5000; "
        "one-sided sign p better = 0.5, p worse = 1",
        "",
    ]  # a figure not measured is left out


def test_the_run_takes_the_cpu_budget_and_the_full_judge_and_a_variant_sets_its_lever_over_it(
    tmp_path: Path,
) -> None:
    budget = CPU_BUDGET["pipeline"]["cpu_assets"]
    run = load_settings(budget_configs(default_config_dir(), tmp_path / "run"))
    cpu = run.pipeline.cpu_assets
    # the issue's task sets: at least 150 anchor tasks and every HumanEval problem, where make run asks fewer
    judge, shipped_judge = run.training.evaluation, load_settings(default_config_dir()).training.evaluation
    assert (judge.anchor_tasks, judge.humaneval_problems) == (160, None)
    assert shipped_judge.anchor_tasks == 24 and shipped_judge.humaneval_problems == 24
    assert (cpu.backlog_per_day, cpu.samples_per_item) == (
        budget["backlog_per_day"],
        budget["samples_per_item"],
    )
    shipped = load_settings(default_config_dir()).pipeline.cpu_assets
    assert (shipped.backlog_per_day, shipped.samples_per_item) != (cpu.backlog_per_day, cpu.samples_per_item)
    variant = {"pipeline": {"cpu_assets": {"samples_per_item": 8}}, "training": {"max_steps": 90}}
    changed = load_settings(budget_configs(default_config_dir(), tmp_path / "variant", variant))
    assert changed.pipeline.cpu_assets.samples_per_item == 8
    assert changed.pipeline.cpu_assets.backlog_per_day == budget["backlog_per_day"]
    assert changed.training.max_steps == 90
    # the daily judge: the shipped training.yaml's task sets, with the CPU budget as before
    daily = load_settings(budget_configs(default_config_dir(), tmp_path / "daily", judge="daily"))
    assert daily.training.evaluation == shipped_judge
    assert daily.pipeline.cpu_assets.backlog_per_day == budget["backlog_per_day"]


def test_the_figures_so_far_are_written_where_a_stopped_run_leaves_them(tmp_path: Path) -> None:
    path = tmp_path / "bench" / "learning_progress.json"
    write = progress_writer(path)
    write({"promotions": 1, "variants": []})
    write({"promotions": 1, "variants": [{"name": "no_replay", "day": date(2026, 11, 1)}]})
    assert json.loads(path.read_text()) == {
        "promotions": 1,
        "variants": [{"name": "no_replay", "day": "2026-11-01"}],
    }


def test_a_shorter_run_takes_the_first_days(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LANES_LEARNING_DAYS", raising=False)
    every = bench_days()
    assert len(every) == 3
    monkeypatch.setenv("LANES_LEARNING_DAYS", "1")
    assert bench_days() == every[:1]
    for wrong in ("0", "4", "two"):
        monkeypatch.setenv("LANES_LEARNING_DAYS", wrong)
        with pytest.raises(ValueError, match="LANES_LEARNING_DAYS"):
            bench_days()


def completion_answers(matched: int, n: int = 10) -> ModelAnswers:
    """A model's answers to n completion points, the first `matched` of them exact."""
    answers = [
        TaskAnswer(
            task=f"p{i}",
            answer="x",
            scores={EXACT_MATCH: float(i < matched), EDIT_SIMILARITY: 1.0 if i < matched else 0.5},
            reason="",
        )
        for i in range(n)
    ]
    return ModelAnswers(model="m", task_sets={"completion": answers})


def test_served_against_base_is_read_from_the_last_judged_days_answers_for_the_label_served(
    tmp_path: Path,
) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    for day, labels in {
        "2026-11-01": {"base": completion_answers(1), "candidate": completion_answers(4)},
        "2026-11-02": {
            "base": completion_answers(1),
            "current": completion_answers(4),
            "candidate": completion_answers(0),
        },
    }.items():
        record = DayAnswers(day=date.fromisoformat(day), candidate=f"lanes-{day}", labels=labels)
        store.write_json(EVALUATION_ASSET, day, ANSWERS_FILE, record.model_dump(mode="json"))
    promoted = LearningPoint(
        day=date(2026, 11, 1), served="lanes-2026-11-01", candidate="lanes-2026-11-01", promoted=True
    )
    rejected = LearningPoint(day=date(2026, 11, 2), served="lanes-2026-11-01", candidate="lanes-2026-11-02")
    quiet = LearningPoint(day=date(2026, 11, 3), served="lanes-2026-11-01", note="no training rows")
    by_figure = {c.figure: c for c in _served_vs_base(store, [promoted, rejected, quiet])}
    # day 2 is the last judged day; the alias still serves day 1's adapter, its label there is "current"
    exact = by_figure["completion_exact_match"]
    assert (exact.n, exact.wins, exact.losses, exact.difference) == (10, 3, 0, 0.3)
    assert _served_vs_base(store, [promoted])[1].wins == 3  # day 1: the promoted candidate
    first = LearningPoint(day=date(2026, 11, 1), served="base", candidate="lanes-2026-11-01")
    assert _served_vs_base(store, [first]) == []  # the base is served: nothing to pair


def test_a_day_stopped_by_a_signal_ends_the_benchmark_instead_of_counting_as_a_failed_day(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []

    def materialize(assets: list, partition_key: str, **_: object) -> SimpleNamespace:
        ran.append(partition_key)
        if partition_key == "2026-11-02":
            STOP_REQUESTED.set()  # what stopped_step does when SIGTERM interrupts a step
        return SimpleNamespace(success=partition_key == "2026-11-01")

    monkeypatch.setattr(learning, "materialize", materialize)
    monkeypatch.setattr(learning, "daily_assets", lambda settings: {})
    try:
        assert learning._backfill(None, {}, ["2026-11-01"]) == []
        with pytest.raises(KeyboardInterrupt):
            learning._backfill(None, {}, ["2026-11-02", "2026-11-03"])
    finally:
        STOP_REQUESTED.clear()
    assert ran == ["2026-11-01", "2026-11-02"]  # no day after the stop

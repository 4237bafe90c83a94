"""The paired promotion rule (promotion.py), its statistics (paired.py) and the day's learning-curve point:
pure."""

from __future__ import annotations

from datetime import date

import pytest

from lanes_pipeline.gpu_lane.judged import EDIT_SIMILARITY, PASSED, TaskAnswer
from lanes_pipeline.gpu_lane.paired import compare, wilson_interval
from lanes_pipeline.gpu_lane.promotion import (
    Decision,
    Figures,
    Scores,
    figure_scores,
    figures_of,
    learning_point,
    paired_decision,
    served_against_base,
)

MARGINS = {"repo_pass_rate": 0.05, "anchor_pass_rate": 0.02, "humaneval_pass1": 0.02}


def similarities(values: list[float]) -> dict[str, float]:
    return {f"p{i:03d}": v for i, v in enumerate(values)}


def passes(passed: int, total: int) -> dict[str, float]:
    return {f"t{i:03d}": 1.0 if i < passed else 0.0 for i in range(total)}


def model(
    completion: list[float], repo: tuple[int, int] = (5, 20), anchor: tuple[int, int] = (20, 150)
) -> Scores:
    return {
        "completion_edit_similarity": similarities(completion),
        "repo_pass_rate": passes(*repo),
        "anchor_pass_rate": passes(*anchor),
        "humaneval_pass1": passes(10, 164),
    }


BASE = [0.5 + 0.001 * (i % 7) for i in range(300)]
BETTER = [v + 0.05 for v in BASE]


def test_the_sign_test_needs_five_wins_and_no_loss_on_twenty_one_pairs() -> None:
    # The arithmetic: with 21 paired tasks, 5 wins and 0 losses is the least that reaches p < 0.05.
    base = passes(2, 21)
    four = compare("repo_pass_rate", "base", passes(6, 21), base, "pass_fail")
    five = compare("repo_pass_rate", "base", passes(7, 21), base, "pass_fail")
    assert (four.wins, four.losses, four.ties, four.n) == (4, 0, 17, 21)
    assert four.p_better == pytest.approx(1 / 16) and four.p_better > 0.05
    assert five.p_better == pytest.approx(1 / 32) and five.p_better < 0.05
    assert five.difference == pytest.approx(5 / 21, abs=1e-4)
    assert five.interval[0] > 0 and five.test == "sign"


def test_a_graded_figure_uses_wilcoxon_and_an_interval_that_holds_the_difference() -> None:
    c = compare("completion_edit_similarity", "base", similarities(BETTER), similarities(BASE), "graded")
    assert c.test == "wilcoxon" and c.wins == 300 and c.p_better < 1e-10 and c.p_worse > 0.99
    assert c.interval[0] <= c.difference <= c.interval[1]
    same = compare("completion_edit_similarity", "base", similarities(BASE), similarities(BASE), "graded")
    assert same.ties == 300 and same.p_better == 1.0 and same.p_worse == 1.0
    # lower is better for a loss: a lower loss wins
    loss = compare("eval_loss", "base", {"a": 1.0, "b": 2.0}, {"a": 1.5, "b": 2.5}, "graded", False)
    assert loss.wins == 2 and loss.difference == -0.5


def test_only_tasks_both_models_answered_are_paired() -> None:
    c = compare("repo_pass_rate", "base", {"a": 1.0, "b": 1.0}, {"b": 0.0, "c": 1.0}, "pass_fail")
    assert c.n == 1 and c.wins == 1


def test_a_candidate_better_on_the_primary_and_within_every_guard_is_promoted() -> None:
    decision = paired_decision(
        {"base": model(BASE), "current": model(BASE), "candidate": model(BETTER)},
        "completion_edit_similarity",
        0.05,
        MARGINS,
    )
    assert decision.promote, decision.reasons
    assert decision.primary == "completion_edit_similarity"
    assert decision.primary_p_value() is not None and decision.primary_p_value() < 0.05
    figures = {(c.figure, c.against) for c in decision.comparisons}
    assert ("completion_edit_similarity", "current") in figures and ("anchor_pass_rate", "base") in figures
    assert any("better, one-sided wilcoxon" in r for r in decision.reasons)


def test_a_candidate_not_shown_better_than_the_current_adapter_is_rejected() -> None:
    decision = paired_decision(
        {"base": model(BASE), "current": model(BETTER), "candidate": model(BETTER)},
        "completion_edit_similarity",
        0.05,
        MARGINS,
    )
    assert not decision.promote
    assert any("vs current" in r and "not shown better" in r for r in decision.reasons)


def test_each_guard_beyond_its_margin_blocks_and_one_within_does_not() -> None:
    scores = {"base": model(BASE), "candidate": model(BETTER, anchor=(16, 150))}  # -2.7 points of anchor
    blocked = paired_decision(scores, "completion_edit_similarity", 0.05, MARGINS)
    assert not blocked.promote and any(
        "anchor_pass_rate vs base" in r and "worse beyond" in r for r in blocked.reasons
    )
    within = {"base": model(BASE), "candidate": model(BETTER, anchor=(18, 150))}  # -1.3 points
    assert paired_decision(within, "completion_edit_similarity", 0.05, MARGINS).promote
    forgot = {"base": model(BASE), "candidate": model(BETTER, repo=(3, 20))}  # -10 points
    assert not paired_decision(forgot, "completion_edit_similarity", 0.05, MARGINS).promote


def test_an_unmeasured_primary_blocks_and_a_guard_without_tasks_does_not() -> None:
    no_points = {"base": model([]), "candidate": model([])}
    decision = paired_decision(no_points, "completion_edit_similarity", 0.05, MARGINS)
    assert not decision.promote and any("not measured" in r for r in decision.reasons)
    empty_repo = {"base": model(BASE, repo=(0, 0)), "candidate": model(BETTER, repo=(0, 0))}
    decision = paired_decision(empty_repo, "completion_edit_similarity", 0.05, MARGINS)
    assert decision.promote and any("repo_pass_rate vs base: no tasks today" in r for r in decision.reasons)
    with pytest.raises(ValueError, match="primary_figure 'loss'"):
        paired_decision(empty_repo, "loss", 0.05, MARGINS)


def answer(task: str, scores: dict[str, float]) -> TaskAnswer:
    return TaskAnswer(task=task, answer="x", scores=scores, reason="r")


def test_figures_are_means_of_the_answers_with_intervals_and_sizes() -> None:
    answers = {
        "repo": [answer("a", {PASSED: 1.0}), answer("b", {PASSED: 0.0})],
        "completion": [answer("p", {EDIT_SIMILARITY: 0.5, "exact_match": 0.0})],
    }
    scores = figure_scores(answers, {"row1": 1.25})
    assert scores["repo_pass_rate"] == {"a": 1.0, "b": 0.0} and scores["eval_loss"] == {"row1": 1.25}
    figures = figures_of(scores, eval_loss=1.3)
    assert figures.repo_pass_rate == 0.5 and figures.tasks["repo_pass_rate"] == 2
    assert figures.intervals["repo_pass_rate"] == wilson_interval(1, 2)
    assert figures.completion_edit_similarity == 0.5 and figures.eval_loss == 1.3
    assert figures.anchor_pass_rate is None


def test_the_learning_point_follows_what_the_alias_serves_after_the_day() -> None:
    day = date(2026, 11, 3)
    base, current, better = (
        Figures(repo_pass_rate=0.2),
        Figures(repo_pass_rate=0.3),
        Figures(repo_pass_rate=0.4),
    )
    figures = {"base": base, "current": current, "candidate": better}
    promoted = learning_point(
        day, "lanes-2026-11-03", Decision(promote=True, reasons=[]), figures, "lanes-2026-11-02"
    )
    assert promoted.served == "lanes-2026-11-03" and promoted.served_figures == better
    rejected = learning_point(day, "c", Decision(promote=False, reasons=[]), figures, "lanes-2026-11-02")
    assert rejected.served == "lanes-2026-11-02" and rejected.served_figures == current
    assert rejected.candidate_figures == better  # a rejected candidate is still drawn
    first = learning_point(day, "c", Decision(promote=False, reasons=[]), {"base": base}, None)
    assert first.served == "base" and first.served_figures == base
    labels = [p.served_label() for p in (promoted, rejected, first)]
    assert labels == ["candidate", "current", None]
    quiet = learning_point(day, None, None, {}, "lanes-2026-11-01", note="no training rows")
    assert quiet.candidate is None and quiet.note == "no training rows" and quiet.base == Figures()


def test_alpha_one_promotes_a_measured_candidate_within_the_guards_without_a_test() -> None:
    same = {"base": model(BASE), "candidate": model(BASE)}
    assert not paired_decision(same, "completion_edit_similarity", 0.05, MARGINS).promote
    assert paired_decision(same, "completion_edit_similarity", 1.0, MARGINS).promote
    forgot = {"base": model(BASE), "candidate": model(BASE, repo=(3, 20))}
    assert not paired_decision(forgot, "completion_edit_similarity", 1.0, MARGINS).promote


def test_served_against_base_pairs_every_figure_exact_match_by_the_sign_test() -> None:
    base = model(BASE) | {"completion_exact_match": passes(38, 440)}
    served = model(BETTER, anchor=(21, 150)) | {"completion_exact_match": passes(44, 440)}
    by_figure = {c.figure: c for c in served_against_base({"base": base, "current": served}, "current")}
    exact = by_figure["completion_exact_match"]
    assert (exact.n, exact.wins, exact.losses, exact.test, exact.against) == (440, 6, 0, "sign", "base")
    assert exact.p_better == pytest.approx(0.5**6)  # 6 discordant pairs, all won
    assert exact.difference == pytest.approx(6 / 440, abs=1e-4)
    similarity = by_figure["completion_edit_similarity"]
    assert similarity.test == "wilcoxon" and similarity.p_better < 1e-6 and similarity.wins == 300
    assert by_figure["anchor_pass_rate"].wins == 1 and by_figure["repo_pass_rate"].n == 20
    assert by_figure["eval_loss"].n == 0  # no eval rows were scored: an empty comparison, not an error
    with pytest.raises(ValueError, match=r"no answers of 'candidate' and 'base' to pair"):
        served_against_base({"base": base, "current": served}, "candidate")

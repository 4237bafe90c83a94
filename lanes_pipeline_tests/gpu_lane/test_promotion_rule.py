"""The promotion rule on executed figures (evaluation.py) and the day's learning-curve point: pure."""

from __future__ import annotations

from datetime import date

from lanes_pipeline.gpu_lane.promotion import Decision, Figures, learning_point, promotion_decision

BASE = Figures(eval_loss=2.0, repo_pass_rate=0.20, humaneval_pass1=0.05)
CURRENT = Figures(eval_loss=1.5, repo_pass_rate=0.30, humaneval_pass1=0.05)
BETTER = Figures(eval_loss=1.4, repo_pass_rate=0.30, humaneval_pass1=0.05)


def decide(candidate: Figures, current: Figures | None = CURRENT, **kwargs: object) -> Decision:
    options = {"loss_margin": 0.05, "humaneval_tolerance": 0.01} | kwargs
    return promotion_decision(candidate, BASE, current, **options)  # type: ignore[arg-type]


def test_a_candidate_within_every_limit_is_promoted_with_a_reason_per_figure() -> None:
    decision = decide(BETTER)
    assert decision.promote, decision.reasons
    assert any("repo_pass_rate 30.00% >= the current adapter's 30.00%" in r for r in decision.reasons)
    assert any("HumanEval pass@1 5.00% >= 4.00%" in r for r in decision.reasons)
    # the first adapter has only the base to beat: its repo_pass_rate against the base's
    first = decide(BETTER.model_copy(update={"repo_pass_rate": 0.2}), current=None)
    assert first.promote and any("the base's 20.00%" in r for r in first.reasons)


def test_each_limit_alone_blocks_the_promotion() -> None:
    # 1.45 is below the current 1.5, but not 5 % below it
    loss = decide(BETTER.model_copy(update={"eval_loss": 1.45}))
    assert not loss.promote and any("not 5.0% below the current adapter" in r for r in loss.reasons)
    repo = decide(BETTER.model_copy(update={"repo_pass_rate": 0.25}))
    assert not repo.promote and any("below the current adapter's 30.00%" in r for r in repo.reasons)
    forgot = decide(BETTER.model_copy(update={"humaneval_pass1": 0.03}))
    assert not forgot.promote and any("more than 1% below the base's 5.00%" in r for r in forgot.reasons)
    # exactly one point below the base's HumanEval pass@1 is still within the default tolerance
    assert decide(BETTER.model_copy(update={"humaneval_pass1": 0.04})).promote


def test_a_figure_that_could_not_be_measured_blocks_except_the_eval_loss() -> None:
    no_tasks = decide(BETTER.model_copy(update={"repo_pass_rate": None}))
    assert not no_tasks.promote and any("repo_pass_rate was not measured" in r for r in no_tasks.reasons)
    no_guard = decide(BETTER.model_copy(update={"humaneval_pass1": None}))
    assert not no_guard.promote and any("HumanEval pass@1 was not measured" in r for r in no_guard.reasons)
    # too few held-out rows: judged on the executed figures alone, and the reason says so
    unjudged = decide(BETTER.model_copy(update={"eval_loss": None}), unjudged_loss="1 held-out row(s)")
    assert unjudged.promote
    assert any("eval loss not judged (1 held-out row(s))" in r for r in unjudged.reasons)
    still_worse = decide(
        BETTER.model_copy(update={"eval_loss": None, "repo_pass_rate": 0.1}), unjudged_loss="no rows"
    )
    assert not still_worse.promote


def test_a_repo_tolerance_widens_only_the_repo_limit() -> None:
    assert decide(BETTER.model_copy(update={"repo_pass_rate": 0.25}), repo_tolerance=0.1).promote
    assert not decide(BETTER.model_copy(update={"repo_pass_rate": 0.15}), repo_tolerance=0.1).promote


def test_the_learning_point_follows_what_the_alias_serves_after_the_day() -> None:
    figures = {"base": BASE, "current": CURRENT, "candidate": BETTER}
    day = date(2026, 11, 2)
    promoted = learning_point(day, "lanes-2026-11-02", decide(BETTER), figures, "lanes-2026-11-01")
    assert promoted.served == "lanes-2026-11-02" and promoted.served_figures == BETTER and promoted.promoted
    rejected = learning_point(day, "lanes-2026-11-02", Decision(promote=False, reasons=[]), figures, "x")
    assert rejected.served == "x" and rejected.served_figures == CURRENT and not rejected.promoted
    first = learning_point(day, "c", Decision(promote=False, reasons=[]), {"base": BASE}, None)
    assert first.served == "base" and first.served_figures == BASE
    quiet = learning_point(day, None, None, {}, "lanes-2026-11-01", note="no training rows")
    assert quiet.candidate is None and quiet.note == "no training rows" and quiet.base == Figures()

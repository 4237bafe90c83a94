"""Deciding whether a candidate adapter is promoted, by paired tests on the same tasks. Pure: the scores are
measured by `measurement.py`; `paired.py` compares them.

Each figure is a mean of per-task scores, and the three models judged (the base, the current adapter, the
candidate) were scored on the same tasks, so the candidate is compared with each of the others task by
task. The rule (`evaluation` in configs/training.yaml):
- the pre-declared **primary figure** (default: the editor's figure, completion edit similarity) is better
  than the base's and the current adapter's, each by a one-sided paired test at `alpha`;
- no **guard** (the executed repository tasks, the anchor set, HumanEval) is worse than the base's or the
  current adapter's by more than its non-inferiority margin (the observed mean drop, in the figure's
  units). A guard with no tasks that day has nothing to lose and does not block; a primary figure with no
  tasks blocks.
Every comparison (n, wins, losses, ties, the difference with its interval, both p-values) is kept with
the decision, and the asset check re-applies the rule to the recorded answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field

from lanes_pipeline.gpu_lane.judged import EDIT_SIMILARITY, EXACT_MATCH, PASSED, TaskAnswer
from lanes_pipeline.gpu_lane.paired import (
    TIE,
    Kind,
    PairedComparison,
    compare,
    mean_interval,
    wilson_interval,
)

FigureName = Literal[
    "completion_edit_similarity",
    "completion_exact_match",
    "repo_pass_rate",
    "anchor_pass_rate",
    "humaneval_pass1",
    "eval_loss",
]
EVAL_ROWS = "eval_rows"  # the held-out rows' per-row losses: a "task set" of the eval-loss figure


class FigureSpec(NamedTuple):
    task_set: str
    score: str
    kind: Kind
    higher_is_better: bool


FIGURES: dict[str, FigureSpec] = {
    "completion_edit_similarity": FigureSpec("completion", EDIT_SIMILARITY, "graded", True),
    "completion_exact_match": FigureSpec("completion", EXACT_MATCH, "pass_fail", True),
    "repo_pass_rate": FigureSpec("repo", PASSED, "pass_fail", True),
    "anchor_pass_rate": FigureSpec("anchor", PASSED, "pass_fail", True),
    "humaneval_pass1": FigureSpec("humaneval", PASSED, "pass_fail", True),
    "eval_loss": FigureSpec(EVAL_ROWS, "loss", "graded", False),
}
GUARDS = ("repo_pass_rate", "anchor_pass_rate", "humaneval_pass1")

# label -> figure -> task id -> score
Scores = dict[str, dict[str, float]]


def figure_scores(answers: Mapping[str, list[TaskAnswer]], row_losses: Mapping[str, float]) -> Scores:
    """One model's per-task scores of every figure, from its answers per task set and its per-row eval
    losses (a figure whose task set it was not asked is left out)."""
    scores: Scores = {}
    for name, spec in FIGURES.items():
        if spec.task_set == EVAL_ROWS:
            if row_losses:
                scores[name] = dict(row_losses)
            continue
        given = answers.get(spec.task_set)
        if given:
            scores[name] = {a.task: a.scores[spec.score] for a in given if spec.score in a.scores}
    return scores


class Figures(BaseModel):
    """One model's figures on the day's tasks, each the mean of its per-task scores. None: not measured."""

    eval_loss: float | None = Field(None, description="mean loss per token on the held-out rows")
    repo_pass_rate: float | None = Field(None, description="share of held-out repository tasks passed")
    anchor_pass_rate: float | None = Field(None, description="share of the anchor set's tasks passed")
    humaneval_pass1: float | None = Field(None, description="HumanEval pass@1, greedy")
    completion_exact_match: float | None = Field(None, description="held-out next lines matched exactly")
    completion_edit_similarity: float | None = Field(None, description="mean edit similarity of next lines")
    eval_loss_by_kind: dict[str, float] = Field({}, description="task kind -> eval loss on its rows")
    intervals: dict[str, tuple[float, float]] = Field({}, description="figure -> 95% interval")
    tasks: dict[str, int] = Field({}, description="figure -> the number of tasks it is the mean of")


def figures_of(scores: Mapping[str, Mapping[str, float]], eval_loss: float | None = None) -> Figures:
    """Means, intervals (Wilson for pass rates, bootstrap for graded scores) and sizes of each figure.
    `eval_loss`: the token-weighted loss, which the per-row mean would misstate."""
    values: dict[str, float] = {}
    intervals: dict[str, tuple[float, float]] = {}
    sizes: dict[str, int] = {}
    for name, per_task in scores.items():
        if not per_task:
            continue
        spec, numbers = FIGURES[name], list(per_task.values())
        values[name] = round(sum(numbers) / len(numbers), 4)
        sizes[name] = len(numbers)
        if spec.kind == "pass_fail":
            intervals[name] = wilson_interval(round(sum(numbers)), len(numbers))
        else:
            intervals[name] = mean_interval(numbers)
    if eval_loss is not None:
        values["eval_loss"] = eval_loss
    return Figures.model_validate({**values, "intervals": intervals, "tasks": sizes})


class Decision(BaseModel):
    promote: bool
    reasons: list[str]
    primary: str | None = Field(None, description="the figure the promotion needed to be better on")
    comparisons: list[PairedComparison] = []

    def primary_p_value(self) -> float | None:
        """The largest p-value of the primary figure's comparisons (the one that must be below alpha)."""
        ps = [c.p_better for c in self.comparisons if c.figure == self.primary and c.n]
        return max(ps) if ps else None


def _describe(c: PairedComparison) -> str:
    return (
        f"{c.figure} vs {c.against}: {c.candidate:.4f} vs {c.reference:.4f} on {c.n} paired task(s) "
        f"({c.wins} won, {c.losses} lost, {c.ties} tied; difference {c.difference:+.4f}, "
        f"95% interval [{c.interval[0]:+.4f}, {c.interval[1]:+.4f}])"
    )


def _primary_reason(c: PairedComparison, alpha: float) -> tuple[bool, str]:
    if c.n == 0:
        return False, f"{c.figure} vs {c.against}: not measured (no paired tasks): not promoted"
    better = c.p_better < alpha or alpha >= 1  # alpha 1: measured is enough (the guards still hold)
    verdict = "better" if better else "not shown better"
    return better, f"{_describe(c)}: {verdict}, one-sided {c.test} p = {c.p_better:.4g} (alpha {alpha:g})"


def _guard_reason(c: PairedComparison, margin: float, higher_is_better: bool) -> tuple[bool, str]:
    if c.n == 0:
        return True, f"{c.figure} vs {c.against}: no tasks today, nothing to lose"
    drop = -c.difference if higher_is_better else c.difference
    held = drop <= margin + TIE
    verdict = "within" if held else "worse beyond"
    return held, f"{_describe(c)}: {verdict} its margin {margin:g} (p worse = {c.p_worse:.4g})"


def paired_decision(
    scores: Mapping[str, Scores], primary: str, alpha: float, margins: Mapping[str, float]
) -> Decision:
    """The rule (see the module's notes) on per-task scores by label: "candidate", "base" and, once an
    adapter is served, "current"."""
    if primary not in FIGURES:
        raise ValueError(f"evaluation.primary_figure {primary!r} is not one of {sorted(FIGURES)}")
    references = [label for label in ("base", "current") if label in scores]
    candidate = scores["candidate"]
    ok, reasons, comparisons = True, [], []
    for figure in [primary, *(g for g in GUARDS if g != primary)]:
        spec = FIGURES[figure]
        for against in references:
            c = compare(
                figure,
                against,
                candidate.get(figure, {}),
                scores[against].get(figure, {}),
                spec.kind,
                spec.higher_is_better,
            )
            comparisons.append(c)
            if figure == primary:
                passed, reason = _primary_reason(c, alpha)
            else:
                passed, reason = _guard_reason(c, margins.get(figure, 0.0), spec.higher_is_better)
            ok = ok and passed
            reasons.append(reason)
    return Decision(promote=ok, reasons=reasons, primary=primary, comparisons=comparisons)


def every_figure(mine: Scores, theirs: Scores, against: str) -> list[PairedComparison]:
    """Every figure of one model's scores against another's, paired by task, by the decision's tests
    (exact sign test for pass/fail, Wilcoxon for graded); a figure neither was scored on is empty."""
    return [
        compare(name, against, mine.get(name, {}), theirs.get(name, {}), spec.kind, spec.higher_is_better)
        for name, spec in FIGURES.items()
    ]


def served_against_base(scores: Mapping[str, Scores], served: str) -> list[PairedComparison]:
    """Every figure of the model the alias serves against the base's, paired on the day's tasks: what the
    user gained. `served` is its label in `scores` ('candidate' when promoted that day, 'current' when an
    earlier adapter still serves). The decision tests the primary figure and guards only; this tests
    every figure, exact match among them, the same way."""
    if served not in scores or "base" not in scores:
        raise ValueError(f"no answers of {served!r} and 'base' to pair: the labels are {sorted(scores)}")
    return every_figure(scores[served], scores["base"], "base")


class LearningPoint(BaseModel):
    """One day of the learning curve (artifacts/adapter_evaluation/<day>/learning.json): the base model,
    the day's candidate and what the stable alias serves after the day's decision, measured that day on
    the same tasks."""

    day: date
    served: str = Field(description="the version the alias serves after the day ('base': none yet)")
    candidate: str | None = Field(None, description="the day's candidate (None: no adapter today)")
    promoted: bool = False
    base: Figures = Figures()
    served_figures: Figures = Figures()
    candidate_figures: Figures = Figures()
    primary_figure: str | None = None
    p_value: float | None = Field(None, description="the primary figure's largest one-sided p-value")
    note: str = Field("", description="no adapter today and why, or why the candidate was not judged")
    evaluation_s: float | None = Field(
        None, description="seconds the day's evaluation took: task sets, every model's answers, eval losses"
    )
    requests: int | None = Field(None, description="answers asked of vLLM that day (not the reused ones)")

    def served_label(self) -> str | None:
        """The served model's label in the day's answers (None: the alias serves the base)."""
        current = None if self.served == "base" else self.served
        label = serving_label(self.promoted, self.candidate, current)
        return None if label == "base" else label


def serving_label(promoted: bool, candidate: str | None, current: str | None) -> str:
    """What the alias serves after a day, as a label of the day's models: 'candidate' when promoted,
    else 'current' when an earlier adapter is served, else 'base'."""
    if promoted and candidate is not None:
        return "candidate"
    return "current" if current is not None else "base"


def learning_point(
    day: date,
    candidate: str | None,
    decision: Decision | None,
    figures: dict[str, Figures],
    current: str | None,
    note: str = "",
    evaluation_s: float | None = None,
    requests: int | None = None,
) -> LearningPoint:
    """The day's point: served = the candidate when promoted, else the current adapter, else the base."""
    promoted = bool(decision and decision.promote)
    base = figures.get("base", Figures())
    label = serving_label(promoted, candidate, current)
    return LearningPoint(
        day=day,
        served={"candidate": candidate, "current": current}.get(label) or "base",
        candidate=candidate,
        promoted=promoted,
        base=base,
        served_figures=figures.get(label, Figures()),
        candidate_figures=figures.get("candidate", Figures()),
        primary_figure=decision.primary if decision else None,
        p_value=decision.primary_p_value() if decision else None,
        note=note,
        evaluation_s=evaluation_s,
        requests=requests,
    )

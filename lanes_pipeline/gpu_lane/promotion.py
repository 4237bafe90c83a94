"""Deciding whether a candidate adapter is promoted, from executed figures: eval loss on the rows of
held-out symbols, `repo_pass_rate` (held-out repository tasks run in the sandbox) and HumanEval pass@1
(the forgetting guard), each for the base model, the current adapter and the candidate. All pure: the
figures are measured by `measurement.py`.

The rule (issue 12): promote only if
- the candidate's eval loss is `loss_margin` below the base's and the current adapter's (when the day has
  enough held-out rows to measure it; without them the candidate is judged on the executed figures alone),
- its `repo_pass_rate` is no lower than the current adapter's (the base's while none is served),
- its HumanEval pass@1 is no more than `humaneval_tolerance` below the base's.
A figure that could not be measured blocks the promotion (except the eval loss, as above), with the reason.
"""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, Field

EPSILON = 1e-9  # rates are rounded to 4 places: equal means equal


class Figures(BaseModel):
    """One served model's figures on the day's tasks. None: not measured (the reason is elsewhere)."""

    eval_loss: float | None = Field(None, description="mean loss on the held-out symbols' rows")
    repo_pass_rate: float | None = Field(None, description="share of held-out repository tasks passed")
    humaneval_pass1: float | None = Field(None, description="HumanEval pass@1, greedy")


class Decision(BaseModel):
    promote: bool
    reasons: list[str]


def _loss_reasons(
    candidate: Figures, others: dict[str, Figures], loss_margin: float, unjudged: str | None
) -> tuple[bool, list[str]]:
    if candidate.eval_loss is None or unjudged is not None:
        why = unjudged or "the eval loss was not measured"
        return True, [f"eval loss not judged ({why}): judged on the executed figures alone"]
    ok, reasons = True, []
    for label, other in others.items():
        if other.eval_loss is None:
            continue
        limit = other.eval_loss * (1 - loss_margin)
        if candidate.eval_loss <= limit:
            reasons.append(
                f"eval loss {candidate.eval_loss:.4f} <= {limit:.4f} "
                f"({label} {other.eval_loss:.4f} - {loss_margin:.1%})"
            )
        else:
            ok = False
            reasons.append(
                f"eval loss {candidate.eval_loss:.4f} is not {loss_margin:.1%} below the {label}'s "
                f"{other.eval_loss:.4f}"
            )
    return ok, reasons


def promotion_decision(
    candidate: Figures,
    base: Figures,
    current: Figures | None,
    loss_margin: float,
    humaneval_tolerance: float,
    unjudged_loss: str | None = None,
    repo_tolerance: float = 0.0,
) -> Decision:
    others = {"base": base} | ({"current adapter": current} if current is not None else {})
    ok, reasons = _loss_reasons(candidate, others, loss_margin, unjudged_loss)

    reference_label, reference = ("current adapter", current) if current is not None else ("base", base)
    if candidate.repo_pass_rate is None or reference.repo_pass_rate is None:
        ok = False
        reasons.append("repo_pass_rate was not measured (no held-out repository tasks): not promoted")
    elif candidate.repo_pass_rate + EPSILON >= reference.repo_pass_rate - repo_tolerance:
        reasons.append(
            f"repo_pass_rate {candidate.repo_pass_rate:.2%} >= the {reference_label}'s "
            f"{reference.repo_pass_rate:.2%}" + (f" - {repo_tolerance:.0%}" if repo_tolerance else "")
        )
    else:
        ok = False
        reasons.append(
            f"repo_pass_rate {candidate.repo_pass_rate:.2%} is below the {reference_label}'s "
            f"{reference.repo_pass_rate:.2%}"
        )

    if candidate.humaneval_pass1 is None or base.humaneval_pass1 is None:
        ok = False
        reasons.append("HumanEval pass@1 was not measured: not promoted")
    else:
        floor = base.humaneval_pass1 - humaneval_tolerance
        if candidate.humaneval_pass1 + EPSILON >= floor:
            reasons.append(
                f"HumanEval pass@1 {candidate.humaneval_pass1:.2%} >= {floor:.2%} "
                f"(base {base.humaneval_pass1:.2%} - {humaneval_tolerance:.0%})"
            )
        else:
            ok = False
            reasons.append(
                f"HumanEval pass@1 {candidate.humaneval_pass1:.2%} is more than {humaneval_tolerance:.0%} "
                f"below the base's {base.humaneval_pass1:.2%}"
            )
    return Decision(promote=ok, reasons=reasons)


class LearningPoint(BaseModel):
    """One day of the learning curve (artifacts/adapter_evaluation/<day>/learning.json): the base model
    and what the stable alias serves after the day's decision, measured that day on the same tasks."""

    day: date
    served: str = Field(description="the version the alias serves after the day ('base': none yet)")
    candidate: str | None = Field(None, description="the day's candidate (None: no adapter today)")
    promoted: bool = False
    base: Figures = Figures()
    served_figures: Figures = Figures()
    note: str = Field("", description="no adapter today and why, or why the candidate was not judged")


def learning_point(
    day: date,
    candidate: str | None,
    decision: Decision | None,
    figures: dict[str, Figures],
    current: str | None,
    note: str = "",
) -> LearningPoint:
    """The day's point: served = the candidate when promoted, else the current adapter, else the base."""
    promoted = bool(decision and decision.promote)
    base = figures.get("base", Figures())
    if promoted and candidate is not None:
        served, served_figures = candidate, figures.get("candidate", Figures())
    elif current is not None:
        served, served_figures = current, figures.get("current", Figures())
    else:
        served, served_figures = "base", base
    return LearningPoint(
        day=day,
        served=served,
        candidate=candidate,
        promoted=promoted,
        base=base,
        served_figures=served_figures,
        note=note,
    )

"""The learning benchmark's targets: what the served model must show against the base after the last day.
Pure: figures and paired comparisons in, one entry per target out, each with its value, what it had to
reach, whether it did and the gap (so a missed target shows how far it is).

- the loss and repository targets of the judge issue (served eval loss at most 0.8 x base's; repository
  pass rate at least base's + 10 points);
- the training issue's: at least one promotion; completion edit similarity and exact match better than
  the base's by a one-sided paired test at ALPHA (exact match also aimed at +5 points); the repository and
  anchor pass rates not significantly lower (their one-sided p-value of being worse not below ALPHA);
  HumanEval pass@1 at least the base's - 1 point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TARGET_LOSS_RATIO = 0.8  # served eval loss <= 0.8 x base's
TARGET_REPO_POINTS = 0.10  # served repo_pass_rate >= base's + 10 points
TARGET_HUMANEVAL_POINTS = 0.01  # served HumanEval pass@1 >= base's - 1 point
TARGET_EXACT_MATCH_POINTS = 0.05  # the exact-match gain aimed at
ALPHA = 0.05


def _target(value: float | None, wanted: float | None, higher_is_better: bool) -> dict[str, Any]:
    if value is None or wanted is None:
        return {"value": value, "target": wanted, "met": False, "gap": None}
    met = value >= wanted - 1e-9 if higher_is_better else value <= wanted + 1e-9
    gap = round(max(0.0, wanted - value) if higher_is_better else max(0.0, value - wanted), 4)
    return {"value": round(value, 4), "target": round(wanted, 4), "met": met, "gap": gap}


def _better(comparison: Mapping[str, Any] | None) -> dict[str, Any]:
    """Served better than base: a positive difference with one-sided p below ALPHA (no comparison: the
    alias serves the base, which is not better than itself)."""
    if comparison is None:
        return {"difference": None, "p_value": None, "n": 0, "met": False}
    met = comparison["difference"] > 0 and comparison["p_better"] < ALPHA
    return {
        "difference": comparison["difference"],
        "p_value": comparison["p_better"],
        "n": comparison["n"],
        "wins": comparison["wins"],
        "losses": comparison["losses"],
        "met": met,
    }


def _not_lower(comparison: Mapping[str, Any] | None) -> dict[str, Any]:
    """Served not significantly lower than base: the one-sided p-value of being worse is not below ALPHA
    (no comparison: the base is served, which is not lower than itself)."""
    if comparison is None:
        return {"difference": 0.0, "p_worse": None, "n": 0, "met": True}
    return {
        "difference": comparison["difference"],
        "p_worse": comparison["p_worse"],
        "n": comparison["n"],
        "wins": comparison["wins"],
        "losses": comparison["losses"],
        "met": comparison["p_worse"] >= ALPHA,
    }


def targets(
    base: Mapping[str, Any],
    served: Mapping[str, Any],
    served_vs_base: Mapping[str, Mapping[str, Any]] | None = None,
    promotions: int = 0,
) -> dict[str, Any]:
    """Every target from the last judged day's figures of base and served, the paired comparisons of
    served against base by figure (`served_vs_base`, empty when the alias serves the base) and the
    promotions over the run."""
    paired = served_vs_base or {}
    loss = base["eval_loss"] * TARGET_LOSS_RATIO if base["eval_loss"] is not None else None
    repo = base["repo_pass_rate"] + TARGET_REPO_POINTS if base["repo_pass_rate"] is not None else None
    human = base["humaneval_pass1"] - TARGET_HUMANEVAL_POINTS if base["humaneval_pass1"] is not None else None
    exact = base.get("completion_exact_match")
    return {
        "eval_loss_at_most_0.8x_base": _target(served["eval_loss"], loss, higher_is_better=False),
        "repo_pass_rate_at_least_base_plus_10_points": _target(served["repo_pass_rate"], repo, True),
        "humaneval_pass1_at_least_base_minus_1_point": _target(served["humaneval_pass1"], human, True),
        "at_least_one_promotion": _target(float(promotions), 1.0, True),
        "completion_edit_similarity_better_p_below_0.05": _better(paired.get("completion_edit_similarity")),
        "completion_exact_match_better_p_below_0.05": _better(paired.get("completion_exact_match")),
        "completion_exact_match_at_least_base_plus_5_points": _target(
            served.get("completion_exact_match"),
            exact + TARGET_EXACT_MATCH_POINTS if exact is not None else None,
            True,
        ),
        "repo_pass_rate_not_significantly_lower": _not_lower(paired.get("repo_pass_rate")),
        "anchor_pass_rate_not_significantly_lower": _not_lower(paired.get("anchor_pass_rate")),
    }

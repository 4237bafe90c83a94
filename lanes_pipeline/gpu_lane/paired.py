"""Paired comparisons of two models on the same tasks: the evidence a promotion rests on. Pure.

Both models answered every task of a task set; each task gives each model a score (1.0/0.0 for a pass-fail
task, a similarity in [0, 1] for a completion point, a loss for an eval row). The comparison pairs them by
task: wins, losses and ties, the mean difference with a paired bootstrap interval, and one-sided p-values
both ways (candidate better; candidate worse) by
- the exact sign test on the discordant pairs (McNemar's exact test) for pass-fail figures,
- the Wilcoxon signed-rank test for graded figures (similarities, losses).
With 21 paired tasks a sign test needs 5 wins and 0 losses for p < 0.05: the sample size is part of the
figure, so every comparison carries its `n`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.stats import binomtest, wilcoxon

Kind = Literal["pass_fail", "graded"]
TIE = 1e-9  # scores are rounded by their producers: a smaller difference is no difference
BOOTSTRAP_RESAMPLES = 2000
INTERVAL = 0.95


class PairedComparison(BaseModel):
    """The candidate against one reference model on one figure's paired tasks."""

    model_config = ConfigDict(frozen=True)

    figure: str
    against: str = Field(description="the reference: 'base', 'current', or the learning bench's 'default'")
    n: int = Field(description="tasks both models were scored on")
    wins: int = Field(description="tasks where the candidate scored better")
    losses: int
    ties: int
    candidate: float = Field(description="the candidate's mean score over the paired tasks")
    reference: float
    difference: float = Field(description="candidate - reference, in the figure's units")
    interval: tuple[float, float] = Field(description="95% paired bootstrap interval of the difference")
    p_better: float = Field(description="one-sided p-value that the candidate is better")
    p_worse: float = Field(description="one-sided p-value that the candidate is worse")
    test: Literal["sign", "wilcoxon", "none"]


def _one_sided_sign(wins: int, losses: int) -> tuple[float, float]:
    discordant = wins + losses
    if discordant == 0:
        return 1.0, 1.0
    better = binomtest(wins, discordant, 0.5, alternative="greater").pvalue
    worse = binomtest(wins, discordant, 0.5, alternative="less").pvalue
    return float(better), float(worse)


def _one_sided_wilcoxon(gains: np.ndarray) -> tuple[float, float]:
    nonzero = gains[np.abs(gains) > TIE]
    if nonzero.size == 0:
        return 1.0, 1.0
    better = wilcoxon(nonzero, alternative="greater").pvalue
    worse = wilcoxon(nonzero, alternative="less").pvalue
    return float(better), float(worse)


def bootstrap_interval(differences: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile interval of the mean difference over tasks resampled with replacement (seeded:
    the same figures give the same interval)."""
    if differences.size == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, differences.size, size=(BOOTSTRAP_RESAMPLES, differences.size))
    means = differences[picks].mean(axis=1)
    tail = (1 - INTERVAL) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return round(float(low), 4), round(float(high), 4)


def compare(
    figure: str,
    against: str,
    candidate: Mapping[str, float],
    reference: Mapping[str, float],
    kind: Kind,
    higher_is_better: bool = True,
    seed: int = 0,
) -> PairedComparison:
    """The candidate's scores against the reference's, paired by task id (tasks only one model was scored
    on are left out). `higher_is_better=False` for losses: a win is then a lower score."""
    tasks = sorted(set(candidate) & set(reference))
    mine = np.array([candidate[t] for t in tasks], dtype=float)
    theirs = np.array([reference[t] for t in tasks], dtype=float)
    differences = mine - theirs
    gains = differences if higher_is_better else -differences
    wins, losses = int((gains > TIE).sum()), int((gains < -TIE).sum())
    if not tasks:
        p_better, p_worse, test = 1.0, 1.0, "none"
    elif kind == "pass_fail":
        (p_better, p_worse), test = _one_sided_sign(wins, losses), "sign"
    else:
        (p_better, p_worse), test = _one_sided_wilcoxon(gains), "wilcoxon"
    return PairedComparison(
        figure=figure,
        against=against,
        n=len(tasks),
        wins=wins,
        losses=losses,
        ties=len(tasks) - wins - losses,
        candidate=round(float(mine.mean()), 4) if tasks else 0.0,
        reference=round(float(theirs.mean()), 4) if tasks else 0.0,
        difference=round(float(differences.mean()), 4) if tasks else 0.0,
        interval=bootstrap_interval(differences, seed),
        p_better=p_better,
        p_worse=p_worse,
        test=test,
    )


def wilson_interval(passed: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a pass rate (the learning chart's error bars)."""
    if total == 0:
        return 0.0, 0.0
    rate = passed / total
    denominator = 1 + z * z / total
    centre = (rate + z * z / (2 * total)) / denominator
    half = z * ((rate * (1 - rate) / total + z * z / (4 * total * total)) ** 0.5) / denominator
    return round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)


def mean_interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """The 95% bootstrap interval of a mean score (a similarity, a loss)."""
    return bootstrap_interval(np.array(values, dtype=float), seed)

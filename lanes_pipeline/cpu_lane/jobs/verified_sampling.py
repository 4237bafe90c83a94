"""Verified sampling: several answers per target, each verified, and what that yielded per task kind.

The CPU lane is slow but nobody waits on it, so each target (a symbol) is asked `samples_per_item` times at
a temperature above zero; every answer is verified on its own and the accepted ones are kept. The samples
of one target differ only in their seed, which is part of the request and so of the response cache's key:
a re-run finds every sample again, and no two samples share a cache entry.

Figures per task kind (`KindYield`):
- `asked`: targets; `sampled`: answers received; `accepted`: answers that passed verification;
- `targets_with_accepted`: targets with at least one accepted answer;
- `pass_at_1`: accepted / sampled, the share of single answers that are accepted. With the same number of
  samples n per target this equals the unbiased estimator of pass@1 (1 - C(n-c, 1) / C(n, 1) = c / n per
  target, averaged);
- `pass_at_n`: targets_with_accepted / asked, the share of targets for which n samples found at least one
  accepted answer (n = the samples asked per target; a target whose requests all failed counts as asked
  and not accepted).

Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest

DEFAULT_TEMPERATURE = 0.8  # above zero, or every sample of a target would be the same answer


class TargetTally(Frozen):
    """One target's answers: how many came back, how many were accepted."""

    target: str
    sampled: int = Field(ge=0)
    accepted: int = Field(ge=0)


class KindYield(Frozen):
    """What one task kind yielded over its targets (definitions in the module docstring)."""

    asked: int = 0
    sampled: int = 0
    accepted: int = 0
    targets_with_accepted: int = 0
    pass_at_1: float = 0.0
    pass_at_n: float = 0.0
    note: str | None = Field(None, description="why the figures are what they are (e.g. not implemented)")


def kind_yield(tallies: Sequence[TargetTally], note: str | None = None) -> KindYield:
    """The figures of one task kind from each target's tally."""
    for tally in tallies:
        if tally.accepted > tally.sampled:
            raise ValueError(f"target {tally.target!r}: {tally.accepted} accepted of {tally.sampled} sampled")
    asked = len(tallies)
    sampled = sum(t.sampled for t in tallies)
    accepted = sum(t.accepted for t in tallies)
    with_accepted = sum(1 for t in tallies if t.accepted > 0)
    return KindYield(
        asked=asked,
        sampled=sampled,
        accepted=accepted,
        targets_with_accepted=with_accepted,
        pass_at_1=round(accepted / sampled, 4) if sampled else 0.0,
        pass_at_n=round(with_accepted / asked, 4) if asked else 0.0,
        note=note,
    )


def sample_id(target_id: str, sample: int) -> str:
    return f"{target_id}#s{sample}"


def samples_of(
    request: BatchRequest, samples: int, temperature: float = DEFAULT_TEMPERATURE
) -> list[BatchRequest]:
    """`samples` copies of `request` at `temperature`, sample i with seed i and id `<id>#s<i>`: distinct
    cache keys, and the same ones on every run."""
    if samples < 1:
        raise ValueError(f"request {request.id!r}: samples must be >= 1, got {samples}")
    if temperature <= 0:
        raise ValueError(f"request {request.id!r}: sampling needs a temperature above 0, got {temperature}")
    return [
        request.model_copy(update={"id": sample_id(request.id, i), "seed": i, "temperature": temperature})
        for i in range(samples)
    ]

"""Decisions of a CPU-lane batch over several endpoints, as pure functions: which endpoint gets the next
item, and what a failed request means for its endpoint and its item. The locking and the I/O around them
live in `endpoint_pool.py`; the runner in `batch.py`.

Why these rules:
- An item goes to the endpoint with the most room (free claims), so work spreads by free slots; an item
  whose prompt prefix another item just put in a server's cache prefers that server, when it has room.
- An endpoint that cannot be reached (after the client's retries), or that answers 5xx and then fails
  its health check, is down for the rest of the batch: no new items go to it, and each of its items that
  was in flight goes back to the queue for the others. With only one endpoint configured there is no
  other to fail over to: the item fails as it always did, and the failure gate decides about the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from lanes_pipeline.errors import LaneError

# Items claimed per slot: twice the slots, so token counting for the next item overlaps generation (the
# slot gate still keeps completion requests at the slots).
CLAIMS_PER_SLOT = 2

FailureAction = Literal["fail_item", "requeue", "all_down"]


@dataclass(frozen=True)
class EndpointView:
    """What the choice needs to know of one endpoint at this moment."""

    up: bool
    slots: int  # requests in flight at most on it
    claimed: int  # items being worked on for it (counting tokens or waiting for / holding a slot)

    @property
    def free(self) -> int:
        return self.slots * CLAIMS_PER_SLOT - self.claimed if self.up else 0


def choose_endpoint(views: Sequence[EndpointView], preferred: int | None = None) -> int | None:
    """The endpoint for the next item: `preferred` when it is up and has an idle slot, else the one with the
    most room (relative to its slots, so a 4-slot server gets twice the work of a 2-slot one; ties go to
    the earlier one). None when none has room (wait) or none is up (see `all_down`).

    An idle slot, not just room for a claim: the batch keeps no more items at once than slots, so a
    preferred server taking claims beyond its slots would starve the others (seen: 4 items at once all went
    to the server holding their prefix, the second server got none)."""
    if preferred is not None and 0 <= preferred < len(views):
        view = views[preferred]
        if view.free > 0 and view.claimed < view.slots:
            return preferred
    candidates = [i for i, view in enumerate(views) if view.free > 0]
    if not candidates:
        return None
    return max(candidates, key=lambda i: (views[i].free / views[i].slots, -i))


def all_down(views: Sequence[EndpointView]) -> bool:
    return not any(view.up for view in views)


def after_endpoint_failure(configured: int, up_after: int) -> FailureAction:
    """What a request that failed for its endpoint's sake (unreachable, or 5xx and an unhealthy server)
    means for its item. `configured`: endpoints in the batch; `up_after`: those still up once this one is
    marked down. One endpoint only: the item fails as before (nothing to fail over to, and the failure
    gate decides); several: the item goes back to the queue while another is up, else the batch fails."""
    if configured <= 1:
        return "fail_item"
    return "requeue" if up_after > 0 else "all_down"


class EndpointReport(BaseModel):
    """One endpoint's part in a batch, for the summary and the Dagster metadata."""

    url: str
    slots: int  # in flight at most: its configured slots, no more than the server's
    answered: int = 0  # items it answered (committed) in this batch
    requeued: int = 0  # its items that went back to the queue when it went down
    down: bool = False
    reason: str | None = None  # why it went down
    slot_copies: int = 0  # slots a group's prefix was copied into (slot_copy.py)
    slot_copy_off: str | None = None  # why copying stopped on this server, when it did
    slot_copies_skipped: int = 0  # copies not made: another client's requests ran on the server


class AllEndpointsDownError(LaneError):
    """Every endpoint of the CPU lane went down during (or before) a batch. What was answered is committed:
    a re-run asks only for the rest."""

    transient = True  # a server that restarts answers the step's retry (errors.is_transient_error)

    def __init__(self, reports: Sequence[EndpointReport]) -> None:
        self.reports = list(reports)
        named = "; ".join(f"{r.url}: {r.reason or 'down'}" for r in reports)
        super().__init__(
            f"CPU lane: every endpoint is down ({named}). The answers so far are committed; a re-run asks "
            "only for the rest once a server is back (cpu_lane.endpoints in configs/lanes.yaml)."
        )

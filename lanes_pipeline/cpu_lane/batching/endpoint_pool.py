"""The endpoints of one CPU-lane batch at run time: each server's client, facts, slot gate and state, and
the lock that hands items to them. The decisions (which endpoint, what a failure means) are the pure
functions of `endpoint_choice.py`; this module only applies them under a lock.

Before a batch every endpoint is asked for its facts (slots, context, weights), in parallel: one that is
unreachable or never becomes ready starts the batch down (with several endpoints; the only one's error
ends the batch as it always did). All must serve the same weights, since the answer cache is keyed by
them: answers of different models must not be mixed under one key.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from lanes_pipeline.cpu_lane.batching.client import CpuClient, ServerInfo
from lanes_pipeline.cpu_lane.batching.endpoint_choice import (
    CLAIMS_PER_SLOT,
    AllEndpointsDownError,
    EndpointReport,
    EndpointView,
    FailureAction,
    after_endpoint_failure,
    all_down,
    choose_endpoint,
)
from lanes_pipeline.cpu_lane.batching.slot_copy import NOT_EVERY_SLOT, SlotCopy
from lanes_pipeline.cpu_lane.batching.slots import CapAdmission, SlotGate
from lanes_pipeline.errors import AuthenticationError, LaneError


@dataclass(frozen=True)
class CpuEndpointClient:
    """One server of the lane for a batch: its client and its configured slots."""

    client: CpuClient
    slots: int


@dataclass
class LiveEndpoint:
    index: int
    client: CpuClient
    info: ServerInfo
    gate: SlotGate
    report: EndpointReport
    claimed: int = 0
    up: bool = True

    @property
    def copies_slots(self) -> bool:
        """Until the server showed it cannot copy a slot (report.slot_copy_off says why)."""
        return self.report.slot_copy_off is None

    def view(self) -> EndpointView:
        return EndpointView(up=self.up, slots=self.gate.limit, claimed=self.claimed)


@dataclass
class EndpointPool:
    """Hands each item an endpoint with room (blocking while none has), and takes an endpoint down."""

    live: list[LiveEndpoint]
    configured: int  # endpoints in the batch's config, those down from the start included
    down_at_start: list[EndpointReport] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def total_limit(self) -> int:
        return sum(e.gate.limit for e in self.live)

    def claim(self, preferred: int | None = None) -> LiveEndpoint:
        """An up endpoint with room for one more item; waits while all are busy. Raises
        AllEndpointsDownError once none is up."""
        with self._cond:
            while True:
                views = [e.view() for e in self.live]
                if all_down(views):
                    raise AllEndpointsDownError(self.reports())
                chosen = choose_endpoint(views, preferred)
                if chosen is not None:
                    self.live[chosen].claimed += 1
                    return self.live[chosen]
                self._cond.wait(timeout=1.0)

    def release(self, endpoint: LiveEndpoint, claims: int = 1) -> None:
        with self._cond:
            endpoint.claimed -= claims
            self._cond.notify_all()

    def pin_slot(self, endpoint: LiveEndpoint) -> int | None:
        """Slot 0 for a group's first request when it is the only item of this batch on the endpoint (its
        slot can be copied once it ends; every slot of the batch is idle, so pinning makes it wait for
        nothing), else None: unpinned, the server chooses, as it always did."""
        with self._cond:
            if endpoint.gate.limit < 2 or not endpoint.copies_slots or endpoint.claimed != 1:
                return None
            return 0

    @contextmanager
    def alone(self, endpoint: LiveEndpoint) -> Iterator[bool]:
        """Whether no item of this batch is on the endpoint now; while the block runs, none is handed to it
        (a slot copy restores into slots that must be idle)."""
        with self._cond:
            alone = endpoint.up and endpoint.claimed == 0
            if alone:
                endpoint.claimed += endpoint.gate.limit * CLAIMS_PER_SLOT
        try:
            yield alone
        finally:
            if alone:
                self.release(endpoint, endpoint.gate.limit * CLAIMS_PER_SLOT)

    def copied(self, endpoint: LiveEndpoint, copy: SlotCopy) -> None:
        with self._cond:
            endpoint.report.slot_copies += len(copy.restored)
            endpoint.report.slot_copies_skipped += copy.skipped is not None
            if copy.off_reason is not None:
                endpoint.report.slot_copy_off = copy.off_reason

    def is_up(self, endpoint: LiveEndpoint) -> bool:
        with self._cond:
            return endpoint.up

    def gave_back(self, endpoint: LiveEndpoint) -> None:
        """One of its items went back to the queue."""
        with self._cond:
            endpoint.report.requeued += 1

    def answered(self, endpoint: LiveEndpoint) -> None:
        with self._cond:
            endpoint.report.answered += 1

    def failed(self, endpoint: LiveEndpoint, reason: str) -> FailureAction:
        """A request failed for the endpoint's sake: take it down (with several endpoints) and say what
        becomes of the item. Its other items in flight fail the same way and each comes back here."""
        with self._cond:
            others_up = sum(e.up and e is not endpoint for e in self.live)
            action = after_endpoint_failure(self.configured, others_up)
            if action == "fail_item":
                return action
            if endpoint.up:
                endpoint.up = False
                endpoint.report.down, endpoint.report.reason = True, reason
            self._cond.notify_all()  # waiting claims: choose again, or learn that all are down
            return action

    def reports(self) -> list[EndpointReport]:
        """Per endpoint, in config order: those that could not start the batch last."""
        return [e.report for e in self.live] + self.down_at_start


def _url_slug(url: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in url.removeprefix("http://").removeprefix("https://"))


def open_endpoints(
    endpoints: Sequence[CpuEndpointClient],
    configured_model: str,
    ready_timeout_s: float,
    lease_dir: Path | None,
    admission: CapAdmission,
) -> EndpointPool:
    """Wait for each endpoint and read its facts; the first endpoint that answers sets the weights."""
    if not endpoints:
        raise ValueError("a batch needs at least one CPU-lane endpoint")

    def prepare(endpoint: CpuEndpointClient) -> ServerInfo:
        endpoint.client.wait_ready(ready_timeout_s)
        return endpoint.client.server_info(configured_model)

    if len(endpoints) == 1:  # the only server: its error is the batch's, as it always was
        outcomes: list[ServerInfo | LaneError] = [prepare(endpoints[0])]
    else:
        with ThreadPoolExecutor(max_workers=len(endpoints), thread_name_prefix="cpu-lane-ready") as pool:
            futures = [pool.submit(prepare, e) for e in endpoints]
            outcomes = []
            for future in futures:
                try:
                    outcomes.append(future.result())
                except AuthenticationError:
                    raise  # a wrong key is a config error, not a server that is down
                except LaneError as exc:
                    outcomes.append(exc)
    live, down = [], []
    for endpoint, outcome in zip(endpoints, outcomes, strict=True):
        url = endpoint.client.base_url
        if isinstance(outcome, LaneError):
            reason = f"not ready before the batch: {outcome}"
            down.append(EndpointReport(url=url, slots=endpoint.slots, down=True, reason=reason))
            continue
        limit = max(1, min(endpoint.slots, outcome.total_slots))
        gate = SlotGate(limit, lease_dir / _url_slug(outcome.url) if lease_dir else None, admission=admission)
        # The slots a batch does not use keep other caches, which can leave no room for a restored copy.
        copy_off = NOT_EVERY_SLOT if outcome.total_slots > limit else None
        report = EndpointReport(url=url, slots=limit, slot_copy_off=copy_off)
        live.append(LiveEndpoint(len(live), endpoint.client, outcome, gate, report))
    if not live:
        raise AllEndpointsDownError(down)
    first = live[0].info
    other = [e for e in live[1:] if e.info.fingerprint != first.fingerprint]
    if other:
        named = ", ".join(f"{e.info.url} ({e.info.identity.model_path})" for e in other)
        raise LaneError(
            f"CPU lane: the endpoints serve different weights: {first.url} serves "
            f"{first.identity.model_path} ({first.identity.meta}), but {named} do not. Answers are cached "
            "by the weights they came from: serve the same model file (same path) on every endpoint of "
            "cpu_lane.endpoints."
        )
    return EndpointPool(live=live, configured=len(endpoints), down_at_start=down)

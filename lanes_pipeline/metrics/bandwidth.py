"""Sharing one workstation's memory bandwidth between the two lanes: the interactive GPU lane comes first.

Both lanes stream weights through the same memory bus (the MoE experts of the CPU lane live in system RAM,
and vLLM's KV cache and any CPU offload too), so a full CPU-lane batch slows every editor request. Two
rules, each with hysteresis so a lane does not flap:

- CPU-lane batch work yields: while vLLM's `/metrics` shows more running requests than a threshold, the
  CPU lane admits at most a configured minimum of in-flight requests, and goes back to its full slots only
  after the GPU lane has been quiet for `quiet_s`. Requests already in flight finish; only new ones wait.
- GPU training waits: it does not start while the CPU lane's server is processing or queueing requests,
  until it has been quiet for `quiet_s` (bounded by a maximum wait).

The first half of this module is pure (`LaneLoad`, `observe`, `in_flight_cap`) and tests without a server;
the second half polls the servers (`GpuYieldGovernor`, `wait_until_quiet`). No Dagster here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import BaseModel

from lanes_pipeline.config.models import BandwidthConfig
from lanes_pipeline.errors import LaneError
from lanes_pipeline.http import NO_RETRY, OpenAIClient
from lanes_pipeline.metrics.prometheus import LaneCounters, MetricsSnapshot, lane_counters

# ---------------------------------------------------------------------------------------------------------
# Decisions (pure)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaneLoad:
    """Whether the other lane holds the bandwidth: set by one busy reading, cleared by `quiet_s` of quiet."""

    holding: bool = False
    quiet_since: float | None = None


def observe(load: LaneLoad, active: float | None, busy_above: float, quiet_s: float, now: float) -> LaneLoad:
    """The next state after one reading of the other lane's active requests at `now` (monotonic seconds).

    A reading of None (the server did not answer /metrics) counts as quiet: a lane that serves nothing has
    nobody to protect, and a CPU lane that stalls on a dead GPU lane would stall the whole day's work.
    """
    if active is not None and active > busy_above:
        return LaneLoad(holding=True, quiet_since=None)
    if not load.holding:
        return load
    since = load.quiet_since if load.quiet_since is not None else now
    if now - since >= quiet_s:
        return LaneLoad(holding=False, quiet_since=None)
    return LaneLoad(holding=True, quiet_since=since)


def in_flight_cap(load: LaneLoad, cpu_min_in_flight: int) -> int | None:
    """The CPU lane's cap on in-flight requests: the minimum while the GPU lane is busy, else none."""
    return cpu_min_in_flight if load.holding else None


# ---------------------------------------------------------------------------------------------------------
# Readings (I/O)
# ---------------------------------------------------------------------------------------------------------


def read_counters(client: OpenAIClient) -> LaneCounters | None:
    """A lane's /metrics as counters, or None when it does not answer (or serves no /metrics)."""
    try:
        return lane_counters(MetricsSnapshot.from_text(client.metrics_text()))
    except (LaneError, ValueError):
        return None


def gpu_running_requests(client: OpenAIClient) -> float | None:
    """`vllm:num_requests_running` (summed over engines), or None when vLLM does not answer."""
    counters = read_counters(client)
    return None if counters is None else counters.requests_running


def cpu_active_requests(client: OpenAIClient) -> float | None:
    """Requests llama-server is processing plus those it deferred (queued for a slot), or None."""
    counters = read_counters(client)
    if counters is None:
        return None
    return counters.requests_running + (counters.requests_waiting or 0.0)


def metrics_client(url: str, api_key: str | None, timeout_s: float) -> OpenAIClient:
    """A client for one lane's /metrics: a poll is its own retry, so one attempt each."""
    return OpenAIClient("metrics", url, api_key, timeout_s=timeout_s, connect_timeout_s=2.0, retry=NO_RETRY)


# ---------------------------------------------------------------------------------------------------------
# The CPU lane yields to the GPU lane
# ---------------------------------------------------------------------------------------------------------


class YieldEvent(BaseModel):
    """A change of the cap: when (seconds since the governor started), what vLLM showed, the new cap."""

    at_s: float
    gpu_running: float | None
    cap: int | None


class YieldReport(BaseModel):
    """What the governor did during one batch, for metadata and logs."""

    gpu_url: str
    started_at: float  # time.monotonic() when the governor started: events are relative to it
    polls: int
    yields: int  # times the CPU lane stepped back
    yielded_s: float  # time spent at the reduced cap
    max_gpu_running: float
    unreadable_polls: int  # /metrics did not answer (counted as quiet)
    events: list[YieldEvent]
    # The reading taken before the batch admitted anything (None: vLLM did not answer it) and the cap it
    # set: a cap that is not None means the batch started at the minimum, the GPU lane being busy already.
    initial_gpu_running: float | None = None
    initial_cap: int | None = None

    def metadata(self) -> dict[str, float | int]:
        return {
            "gpu_yields": self.yields,
            "gpu_yielded_s": round(self.yielded_s, 3),
            "gpu_max_running": self.max_gpu_running,
        }


# How long the reading that decides a batch's starting cap may take (the thread's polls wait 5 s).
FIRST_READING_TIMEOUT_S = 30.0


class GpuYieldGovernor:
    """Polls the GPU lane's /metrics in a thread and says how many CPU-lane requests may be in flight.

    `cap()` is what the CPU lane's slot gate asks before admitting a request: None (no cap) or the minimum.
    `read` is injectable for tests of the timing; by default it reads vLLM's `/metrics` at `gpu_url`.
    """

    def __init__(
        self,
        gpu_url: str,
        policy: BandwidthConfig,
        api_key: str | None = None,
        on_change: Callable[[YieldEvent], None] | None = None,
        read: Callable[[], float | None] | None = None,
    ) -> None:
        self.gpu_url, self.policy, self.api_key = gpu_url, policy, api_key
        self.on_change = on_change
        self._read = read
        self._load = LaneLoad()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._polls = self._unreadable = self._yields = 0
        self._max_running = 0.0
        self._yielded_s = 0.0
        self._holding_since: float | None = None
        self._events: list[YieldEvent] = []
        self._initial_gpu_running: float | None = None
        self._initial_cap: int | None = None

    def cap(self) -> int | None:
        with self._lock:
            return in_flight_cap(self._load, self.policy.cpu_min_in_flight)

    def poll_once(self, running: float | None, now: float | None = None) -> None:
        """Feed one reading (the thread does this every `poll_s`; tests may call it directly)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            before = self._load
            self._load = observe(before, running, self.policy.gpu_busy_above, self.policy.quiet_s, now)
            self._polls += 1
            if running is None:
                self._unreadable += 1
            else:
                self._max_running = max(self._max_running, running)
            changed = before.holding != self._load.holding
            if changed and self._load.holding:
                self._yields += 1
                self._holding_since = now
            elif changed and self._holding_since is not None:
                self._yielded_s += now - self._holding_since
                self._holding_since = None
            event = None
            if changed:
                cap = in_flight_cap(self._load, self.policy.cpu_min_in_flight)
                event = YieldEvent(at_s=round(now - self._started, 3), gpu_running=running, cap=cap)
                self._events.append(event)
        if event is not None and self.on_change is not None:
            self.on_change(event)

    def report(self) -> YieldReport:
        with self._lock:
            yielded = self._yielded_s
            if self._holding_since is not None:
                yielded += time.monotonic() - self._holding_since
            return YieldReport(
                gpu_url=self.gpu_url,
                started_at=self._started,
                polls=self._polls,
                yields=self._yields,
                yielded_s=yielded,
                max_gpu_running=self._max_running,
                unreadable_polls=self._unreadable,
                events=list(self._events),
                initial_gpu_running=self._initial_gpu_running,
                initial_cap=self._initial_cap,
            )

    def _run(self) -> None:
        client = metrics_client(self.gpu_url, self.api_key, timeout_s=5.0)
        read = self._read or (lambda: gpu_running_requests(client))
        try:
            while not self._stop.is_set():
                self.poll_once(read())
                self._stop.wait(self.policy.poll_s)
        finally:
            client.close()

    def start(self) -> GpuYieldGovernor:
        self._started = time.monotonic()
        # The first reading comes before any request is admitted: a batch that starts while the GPU lane
        # is busy starts at the minimum, not at full slots for one poll interval.
        # A vLLM that is generating on a loaded machine can take longer than a poll's 5 s to answer
        # /metrics (seen in CI: the first reading timed out, the batch started at full slots, and the
        # next poll read 2 running); this one reading is worth waiting for. A GPU lane that is down
        # refuses the connection at once, so only a live, slow server costs the wait.
        if self._read is not None:
            first = self._read()
        else:
            with metrics_client(self.gpu_url, self.api_key, FIRST_READING_TIMEOUT_S) as client:
                first = gpu_running_requests(client)
        self.poll_once(first)
        self._initial_gpu_running, self._initial_cap = first, self.cap()
        self._thread = threading.Thread(target=self._run, name="gpu-yield-governor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 + self.policy.poll_s)
            self._thread = None


@contextmanager
def yielding_to_gpu(
    gpu_url: str | None,
    policy: BandwidthConfig,
    api_key: str | None = None,
    on_change: Callable[[YieldEvent], None] | None = None,
) -> Iterator[GpuYieldGovernor | None]:
    """A running governor for the body, or None when there is no GPU lane to yield to."""
    if gpu_url is None:
        yield None
        return
    governor = GpuYieldGovernor(gpu_url, policy, api_key, on_change).start()
    try:
        yield governor
    finally:
        governor.stop()


# ---------------------------------------------------------------------------------------------------------
# GPU training waits for a quiet CPU lane
# ---------------------------------------------------------------------------------------------------------


class QuietWait(BaseModel):
    """How waiting for a quiet lane went."""

    waited_s: float
    polls: int
    max_active: float
    quiet: bool  # False: gave up after max_wait_s with the lane still busy


def wait_until_quiet(
    read: Callable[[], float | None],
    quiet_s: float,
    max_wait_s: float,
    poll_s: float = 1.0,
    busy_above: float = 0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_busy: Callable[[float], None] | None = None,
) -> QuietWait:
    """Return as soon as the lane is not holding the bandwidth: at once when the first reading is quiet,
    else after `quiet_s` of quiet readings; give up after `max_wait_s`. `on_busy` gets each busy reading."""
    started = clock()
    load, polls, max_active = LaneLoad(), 0, 0.0
    while True:
        now = clock()
        active = read()
        polls += 1
        max_active = max(max_active, active or 0.0)
        load = observe(load, active, busy_above, quiet_s, now)
        if not load.holding:
            return QuietWait(waited_s=round(now - started, 3), polls=polls, max_active=max_active, quiet=True)
        if active is not None and active > busy_above and on_busy is not None:
            on_busy(active)
        if now - started >= max_wait_s:
            return QuietWait(
                waited_s=round(now - started, 3), polls=polls, max_active=max_active, quiet=False
            )
        sleep(poll_s)

"""Bandwidth-aware lanes: the CPU lane yields to the interactive GPU lane, and training waits for a quiet CPU
lane. Decisions first (no server), then the real thing: a synthetic interactive load on the real vLLM while
a CPU-lane batch runs on the real llama-server."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest
from lanes_pipeline.cpu_lane.batching.batch_summary import BatchProgress
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.batching.slots import SlotGate
from lanes_pipeline.cpu_lane.jobs.prompts import ASK, PromptLayout
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.resources import GpuLaneResource
from lanes_pipeline.http import ChatMessage, ChatRequest
from lanes_pipeline.metrics.bandwidth import (
    GpuYieldGovernor,
    LaneLoad,
    YieldReport,
    cpu_active_requests,
    in_flight_cap,
    observe,
    wait_until_quiet,
)
from lanes_pipeline.settings import (
    BandwidthConfig,
    ConfigError,
    CpuLane,
    Settings,
    load_settings,
    project_root,
)

# -- decisions ---------------------------------------------------------------------------------------------


def test_one_busy_reading_yields_and_quiet_readings_release_only_after_quiet_s() -> None:
    load = observe(LaneLoad(), 2, busy_above=0, quiet_s=5, now=100.0)
    assert load == LaneLoad(holding=True)
    assert in_flight_cap(load, cpu_min_in_flight=1) == 1
    load = observe(load, 0, busy_above=0, quiet_s=5, now=101.0)  # quiet, but not for long enough
    assert load.holding and load.quiet_since == 101.0
    load = observe(load, 0, busy_above=0, quiet_s=5, now=105.9)
    assert load.holding
    load = observe(load, 1, busy_above=0, quiet_s=5, now=106.0)  # busy again: the quiet period restarts
    assert load == LaneLoad(holding=True)
    load = observe(load, 0, busy_above=0, quiet_s=5, now=107.0)
    load = observe(load, 0, busy_above=0, quiet_s=5, now=112.0)
    assert load == LaneLoad(holding=False)
    assert in_flight_cap(load, cpu_min_in_flight=1) is None


def test_threshold_is_exclusive_and_an_unreadable_lane_counts_as_quiet() -> None:
    assert not observe(LaneLoad(), 3, busy_above=3, quiet_s=0, now=0).holding
    assert observe(LaneLoad(), 4, busy_above=3, quiet_s=0, now=0).holding
    assert not observe(LaneLoad(), None, busy_above=0, quiet_s=0, now=0).holding
    released = observe(LaneLoad(holding=True, quiet_since=0.0), None, busy_above=0, quiet_s=2, now=2.0)
    assert not released.holding


def test_governor_counts_yields_and_reports_changes() -> None:
    events = []
    governor = GpuYieldGovernor(
        "http://gpu.invalid", BandwidthConfig(quiet_s=1, cpu_min_in_flight=2), on_change=events.append
    )
    for now, running in ((0.0, 0), (1.0, 3), (2.0, 0), (3.5, 0), (4.0, 1), (4.5, 0), (6.0, 0)):
        governor.poll_once(running, now=now)
    report = governor.report()
    assert report.yields == 2 and report.polls == 7 and report.max_gpu_running == 3
    assert [e.cap for e in events] == [2, None, 2, None]
    assert report.yielded_s == pytest.approx((3.5 - 1.0) + (6.0 - 4.0))
    assert governor.cap() is None


def test_the_first_reading_is_taken_before_start_returns() -> None:
    """A batch starting while the GPU lane is busy starts at the minimum, not at full slots for one poll."""
    policy = BandwidthConfig(cpu_min_in_flight=1, poll_s=60)
    busy = GpuYieldGovernor("http://gpu.invalid", policy, read=lambda: 2)
    quiet = GpuYieldGovernor("http://gpu.invalid", policy, read=lambda: 0)
    try:
        assert busy.start().cap() == 1 and busy.report().initial_cap == 1
        assert busy.report().initial_gpu_running == 2
        assert quiet.start().cap() is None and quiet.report().initial_cap is None
        assert quiet.report().initial_gpu_running == 0
    finally:
        busy.stop()
        quiet.stop()


class SlowMetrics(BaseHTTPRequestHandler):
    """A fake vLLM whose /metrics answers after 6 s with two running requests. Fake because a real vLLM's
    slow /metrics (seen in CI on 2 loaded cores) cannot be produced on demand."""

    def do_GET(self) -> None:
        time.sleep(6)
        body = b"".join(
            b'vllm:%s{model_name="m",engine="0"} %s\n' % sample
            for sample in (
                (b"num_requests_running", b"2.0"),
                (b"prompt_tokens_total", b"10.0"),
                (b"generation_tokens_total", b"20.0"),
            )
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_slow_first_reading_is_waited_for_and_an_absent_gpu_lane_is_not() -> None:
    """The reading that sets a batch's starting cap outlasts a poll's 5 s timeout; a refused one is quiet."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowMetrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    policy = BandwidthConfig(cpu_min_in_flight=1, poll_s=60)
    slow = GpuYieldGovernor(f"http://127.0.0.1:{server.server_address[1]}", policy)
    with socket.socket() as closed:  # a port nobody listens on once this socket closes
        closed.bind(("127.0.0.1", 0))
        refused_port = closed.getsockname()[1]
    absent = GpuYieldGovernor(f"http://127.0.0.1:{refused_port}", policy)
    try:
        assert slow.start().report().initial_cap == 1
        started = time.monotonic()
        assert absent.start().report().initial_cap is None
        assert absent.report().initial_gpu_running is None and absent.report().unreadable_polls >= 1
        assert time.monotonic() - started < 3
    finally:
        slow.stop()
        absent.stop()
        server.shutdown()
        server.server_close()


def test_slot_gate_admits_no_more_than_the_cap_and_recovers_when_it_lifts() -> None:
    cap: list[int | None] = [1]
    gate = SlotGate(3, poll_s=0.005, cap=lambda: cap[0])
    release = threading.Event()
    peak_while_capped = 0

    def worker() -> None:
        with gate.hold():
            release.wait(5)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        peak_while_capped = max(peak_while_capped, gate.in_flight)
        time.sleep(0.005)
    cap[0] = None
    deadline = time.monotonic() + 5
    while gate.in_flight < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    recovered = gate.in_flight
    release.set()
    for thread in threads:
        thread.join(5)
    assert peak_while_capped == 1
    assert recovered == 3


def test_wait_until_quiet_starts_at_once_on_a_quiet_lane_and_gives_up_on_a_busy_one() -> None:
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    def now() -> float:
        return clock[0]

    quiet = wait_until_quiet(lambda: 0, quiet_s=5, max_wait_s=60, clock=now, sleep=sleep)
    assert quiet.quiet and quiet.waited_s == 0 and quiet.polls == 1

    readings = iter([2, 2, 1, 0, 0, 0, 0, 0, 0, 0])
    clock[0] = 0.0
    settled = wait_until_quiet(
        lambda: next(readings), quiet_s=3, max_wait_s=60, poll_s=1, clock=now, sleep=sleep
    )
    assert settled.quiet and settled.waited_s == 6 and settled.max_active == 2  # quiet from t=3 to t=6

    clock[0] = 0.0
    busy = wait_until_quiet(lambda: 1, quiet_s=3, max_wait_s=10, poll_s=1, clock=now, sleep=sleep)
    assert not busy.quiet and busy.waited_s == 10


def test_bandwidth_config_is_validated(tmp_path: Path) -> None:
    for name in ("models.yaml", "repos.yaml", "training.yaml", "pipeline.yaml"):
        (tmp_path / name).write_text((project_root() / "configs" / name).read_text())
    (tmp_path / "lanes.yaml").write_text(
        "cpu_lane: {max_slots: 2}\nbandwidth: {cpu_min_in_flight: 3, gpu_busy_abve: 1}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert "lanes.yaml: bandwidth.gpu_busy_abve: unknown key" in str(caught.value)
    (tmp_path / "lanes.yaml").write_text("cpu_lane: {max_slots: 2}\nbandwidth: {cpu_min_in_flight: 3}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert "bandwidth.cpu_min_in_flight 3 exceeds cpu_lane.max_slots 2" in str(caught.value)


# -- the real lanes ----------------------------------------------------------------------------------------


class InteractiveLoad:
    """Editor-like traffic on the GPU lane: `users` clients, each asking again as soon as answered. Each
    user's answers are 11 tokens longer than the one before's (lengths that share no small multiple): with
    equal lengths vLLM batched them and ended them in the same step, so both users were between requests at
    once and a reading could find vLLM idle (seen in a run of the suite: the batch's first reading did, just
    after the test's own had seen it busy)."""

    def __init__(self, url: str, model: str, users: int = 2, max_tokens: int = 48) -> None:
        self.url, self.model, self.users, self.max_tokens = url, model, users, max_tokens
        self.answered = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._user, args=(i,), daemon=True) for i in range(users)]

    def _user(self, index: int) -> None:
        with VllmClient(self.url, timeout_s=120) as client:
            turn = 0
            while not self._stop.is_set():
                prompt = f"User {index}, turn {turn}: write a short Python function that adds two numbers."
                request = ChatRequest(
                    model=self.model,
                    messages=[ChatMessage(role="user", content=prompt)],
                    max_tokens=self.max_tokens + 11 * index,
                )
                client.chat(request)
                self.answered += 1
                turn += 1

    def start(self) -> InteractiveLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)


def _request_gauges(url: str) -> list[str]:
    """The server's own lines about requests in flight or waiting, for an assertion's message."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10.0).text
    except httpx.HTTPError as exc:
        return [f"GET {url}/metrics failed: {exc!r}"]
    wanted = ("requests_processing", "requests_deferred", "num_requests_running", "num_requests_waiting")
    return [line for line in text.splitlines() if not line.startswith("#") and any(w in line for w in wanted)]


class HeldBusy:
    """vLLM held busy by the test, not by timing: one streamed answer generated past end-of-text (vLLM's
    `ignore_eos`) is always in flight, asked again if it ends, until `release()` closes its stream (vLLM
    aborts a request whose client has gone). A long answer left to run on its own is not enough: it can end
    between the test seeing it run and the batch's first reading, before the short users' first requests
    arrive, and the batch then starts at full slots."""

    def __init__(self, url: str, model: str, max_tokens: int = 1900) -> None:
        self.url = url
        prompt = ChatMessage(role="user", content="Write a long Python module of utility functions.")
        request = ChatRequest(model=model, messages=[prompt], max_tokens=max_tokens, ignore_eos=True)
        self.body = request.payload() | {"stream": True}
        self._generating = threading.Event()
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        with httpx.Client(base_url=self.url, timeout=httpx.Timeout(300.0, connect=10.0)) as http:
            while not self._released.is_set():
                with http.stream("POST", "/v1/chat/completions", json=self.body) as response:
                    response.raise_for_status()
                    for line in response.iter_lines():
                        if '"content"' in line:
                            self._generating.set()
                        if self._released.is_set():
                            break  # leaving the block closes the stream

    def start(self, timeout_s: float = 120) -> HeldBusy:
        """Returns once vLLM is generating the held answer's tokens: a reading taken now finds it running."""
        self._thread.start()
        assert self._generating.wait(timeout_s), "vLLM generated no token of the held answer"
        return self

    def release(self) -> None:
        self._released.set()

    def join(self, timeout_s: float = 60) -> None:
        self._thread.join(timeout_s)


def counting(count: int, max_tokens: int) -> list[BatchRequest]:
    """Requests whose answers run to max_tokens (counting never ends early), so the batch outlasts the
    governor's quiet_s on a fast machine too: the recovery must happen while items are still pending."""
    layout = PromptLayout(ASK, shared_context="This is a test of a batch client.")
    return [
        layout.build(f"count{i}", f"Count from {i} to {i + 200}, one number per line.", max_tokens)
        for i in range(count)
    ]


class Trace:
    """llama-server's own count of requests processing, polled beside the batch: (start, end, processing)."""

    def __init__(self, cpu_url: str) -> None:
        self.cpu_url = cpu_url
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with CpuClient(self.cpu_url, timeout_s=10.0) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                processing = client.counters().requests_running
                self.samples.append((started, time.monotonic(), processing))
                self._stop.wait(0.03)

    def __enter__(self) -> Trace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def capped_periods(report: YieldReport, end: float) -> list[tuple[float, float]]:
    """(from, to) monotonic times during which the governor's cap was the minimum."""
    periods, since = [], None
    for event in report.events:
        moment = report.started_at + event.at_s
        if event.cap is not None and since is None:
            since = moment
        elif event.cap is None and since is not None:
            periods.append((since, moment))
            since = None
    return [*periods, (since, end)] if since is not None else periods


# Both lanes loaded at once (a 1900-token vLLM answer held busy, interactive users, a 64-item batch): the
# governor's rules have fast tests of their own above, and the fast tier's real-server test of the yield is
# the training's wait below.
@pytest.mark.slow
def test_cpu_lane_drops_to_the_minimum_under_interactive_load_and_recovers(
    cpu_server: EmbeddedServer, gpu_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    """Through the CPU-lane resource as the assets use it: vLLM busy -> one request in flight on
    llama-server; vLLM quiet for quiet_s -> both slots again. Seen by the servers' own /metrics."""
    cpu_lane = CpuLaneResource(
        config=settings.lanes.cpu_lane.model_copy(
            update={"base_url": cpu_server.url, "cache_path": str(tmp_path / "cache.sqlite3")}
        ),
        bandwidth=BandwidthConfig(gpu_busy_above=0, cpu_min_in_flight=1, quiet_s=1.5, poll_s=0.1),
        gpu=settings.lanes.gpu_lane.model_copy(update={"base_url": gpu_server.url}),
    )
    model = settings.lanes.gpu_lane.served_model_name
    # vLLM busy from before the batch's first reading until the test lets it go quiet.
    held = HeldBusy(gpu_server.url, model).start()
    load = InteractiveLoad(gpu_server.url, model, max_tokens=16).start()
    # The first item runs alone anyway (the shared prefix); the load ends 2 s after it, so the second runs
    # under the cap where it would otherwise fan out. Answers of 8 tokens: under vLLM's load on 2 cores
    # llama-server's first 32-token answer took 86 s; the rest outlast the load's drain and quiet_s.
    items = 64
    try:
        stopped = threading.Event()

        def end_interactive_load(progress: BatchProgress) -> None:
            if progress.done >= 1 and not stopped.is_set():
                stopped.set()
                threading.Timer(2.0, release).start()

        def release() -> None:
            held.release()
            load.stop()

        with Trace(cpu_server.url) as trace:
            result = cpu_lane.run_batch(counting(items, max_tokens=8), progress=end_interactive_load)
            ended = time.monotonic()
    finally:
        held.release()
        load.stop()
        held.join()
    report = result.bandwidth
    assert report is not None and result.summary.ok == result.summary.items == items
    assert load.answered > 0 and report.max_gpu_running >= 1, (report, _request_gauges(gpu_server.url))
    assert report.events[0].cap == 1 and report.events[-1].cap is None, report.events
    # vLLM was busy before the batch: it started at the minimum
    assert report.initial_gpu_running and report.initial_cap == 1, report
    # The first capped period began before anything was admitted. In a later one (vLLM busy again after a
    # pause), requests admitted while free finish normally: a sample counts as capped there once the
    # slowest CPU-lane request of the batch has had time to end.
    slowest = max(item.metrics.latency_s for item in result.results if item.metrics is not None)
    periods = capped_periods(report, trace.samples[-1][1])
    settled = [(a + (0.0 if i == 0 else slowest), b) for i, (a, b) in enumerate(periods)]
    capped = [p for start, end, p in trace.samples if any(a <= start and end <= b for a, b in settled)]
    after = report.started_at + report.events[-1].at_s
    free = [p for start, end, p in trace.samples if start >= after]
    assert capped and max(capped) == 1  # llama-server never saw two CPU-lane requests while vLLM was busy
    assert free and max(free) == 2  # and both slots again once vLLM had been quiet for quiet_s
    print(
        f"vLLM max running {report.max_gpu_running:g}; CPU lane yielded {report.yielded_s:.1f} s "
        f"({report.yields} time(s)); llama-server processing: max {max(capped):g} over {len(capped)} samples "
        f"while capped, max {max(free):g} over {len(free)} samples after; "
        f"{load.answered} interactive answers; the batch went on {ended - after:.1f} s after the recovery"
    )


def test_training_waits_while_a_cpu_lane_batch_holds_the_bandwidth(
    cpu_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    """What lora_adapter does before training, against the real llama-server: start at once on a quiet
    CPU lane; wait while a batch runs, and start once it has been quiet for quiet_s."""
    gpu_lane = GpuLaneResource.from_config(
        settings.lanes.gpu_lane,
        # quiet_s 2: a batch ends a moment after its last request (counters, cache commit); the lane must
        # stay quiet past that for the wait to be over
        bandwidth=BandwidthConfig(quiet_s=2.0, poll_s=0.1),
        cpu=settings.lanes.cpu_lane.model_copy(update={"base_url": cpu_server.url}),
    )
    idle = gpu_lane.wait_for_quiet_cpu_lane()
    assert idle is not None and idle.quiet and idle.polls == 1 and idle.waited_s < 1

    cpu_lane = CpuLaneResource(
        config=CpuLane(base_url=cpu_server.url, cache_path=str(tmp_path / "cache.sqlite3")),
        bandwidth=BandwidthConfig(yield_to_gpu=False),
    )
    finished: list[float] = []
    # Answers that run to max_tokens: on ik a 24-token answer takes 0.1 s, and the wait's first reading
    # could fall between two items (a quiet first reading means no wait at all).
    batch = threading.Thread(
        target=lambda: (cpu_lane.run_batch(counting(6, max_tokens=64)), finished.append(time.monotonic()))
    )
    batch.start()
    # Both slots busy: the batch has fanned out. Its first request runs alone and its prefix is then copied
    # into the other slot, a moment with nothing in flight in which a first reading finds the lane quiet
    # (seen: a reading just after this loop had seen the first request).
    deadline = time.monotonic() + 60
    readings: list[float | None] = []
    with CpuClient(cpu_server.url) as client:
        while time.monotonic() < deadline:
            readings.append(cpu_active_requests(client))
            if (readings[-1] or 0) >= 2:
                break
            time.sleep(0.02)
    busy_seen: list[float] = []
    waited = gpu_lane.wait_for_quiet_cpu_lane(on_busy=busy_seen.append)
    started_training = time.monotonic()
    batch.join(timeout=300)
    # What llama-server said while the batch fanned out: the cause, if the wait below saw a quiet lane.
    answered = [r for r in readings if r is not None]
    seen = (
        f"{len(readings)} readings before the wait, max {max(answered, default=0):g}, "
        f"{len(readings) - len(answered)} unanswered; now {_request_gauges(cpu_server.url)}"
    )
    assert readings and (readings[-1] or 0) >= 2, seen
    assert waited is not None and waited.quiet and waited.max_active >= 1 and busy_seen, (waited, seen)
    assert finished and started_training >= finished[0] + 0.9  # after the batch and ~a quiet second
    no_wait = gpu_lane.bandwidth.model_copy(update={"training_waits_for_cpu_lane": False})
    assert not gpu_lane.model_copy(update={"bandwidth": no_wait}).wait_for_quiet_cpu_lane()

"""CPU-lane faults, each on a private real llama-server: killed mid-batch and restarted, still loading,
and guarded by an API key the client gets wrong; and on the session's server, the client process SIGKILLed
mid-batch and a batch stopped mid-generation. No fake servers: the real one produces all of these."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import get_args

import pytest

from lanes_pipeline.cpu_lane.batching.answer_cache import ResponseCache
from lanes_pipeline.cpu_lane.batching.batch import BatchRunner
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.jobs.prompts import ASK, PromptLayout
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.errors import AuthenticationError, LaneError
from lanes_pipeline.settings import CpuEngineName, CpuLane, RetryPolicy, Settings
from lanes_pipeline_tests.conftest import settings_with_cpu_engine
from lanes_pipeline_tests.cpu_lane.fixtures import (
    batch_config,
    first_done,
    private_cpu_server,
    questions,
    run_batch,
    settings_with_cpu_lane,
)

ITEMS = 8
# The batch client of test_a_client_killed_mid_batch..., run as a process of its own to be SIGKILLed.
BATCH_CLIENT = """
import sys
from pathlib import Path

from lanes_pipeline.settings import load_settings
from lanes_pipeline_tests.cpu_lane.fixtures import batch_config, questions, run_batch

url, cache_path, items, max_tokens, offset = sys.argv[1], Path(sys.argv[2]), *map(int, sys.argv[3:])
run_batch(url, cache_path, batch_config(load_settings()), questions(items, max_tokens, offset))
"""


@pytest.mark.usefixtures("cpu_engine")
def test_kill_mid_batch_loses_nothing_and_the_rerun_asks_only_the_missing(
    settings: Settings, tmp_path: Path
) -> None:
    requests = questions(ITEMS, max_tokens=8, offset=100)
    # Few, quick retries: against a dead server each remaining item fails fast, as it would after a crash.
    config = batch_config(settings)
    retry = RetryPolicy(max_attempts=2, backoff_base_s=0.05, backoff_max_s=0.1)
    cache_path = tmp_path / "resume.sqlite3"
    with private_cpu_server(settings) as server:
        crashed = run_batch(
            server.url, cache_path, config, requests, progress=first_done(3, server.kill), retry=retry
        )
        assert server.process is None  # it really was killed mid-batch

        ok_before = [r for r in crashed.results if r.status == "ok"]
        failed_before = [r for r in crashed.results if r.status == "failed"]
        assert len(ok_before) >= 3 and failed_before, "the kill must land mid-batch"
        assert {r.failure.kind for r in failed_before if r.failure} <= {"unreachable", "server_error"}
        # Each failed item names itself and was retried (connection refused) before it was given up.
        assert all(
            r.failure and r.id in r.failure.reason and "after 2 attempts" in r.failure.reason
            for r in failed_before
        )
        # Everything answered before the kill is committed: a fresh connection reads it all back.
        with ResponseCache(cache_path) as cache:
            committed = cache.get_many([r.key for r in crashed.results])
            assert set(committed) == {r.key for r in ok_before}
            assert all(committed[r.key].text == r.text for r in ok_before)
            assert {f.item_id for f in cache.failures()} == {r.id for r in failed_before}

        server.start()  # same port, same weights: same fingerprint
        with CpuClient(server.url) as client:
            before = client.counters()
            resumed = run_batch(server.url, cache_path, config, requests, retry=retry)
            asked_prompt, asked_generated = client.counters().tokens_since(before)
        summary = resumed.summary
        assert summary.failed == 0, [r.failure for r in resumed.results]
        assert summary.cache_hits == len(ok_before)
        assert summary.answered == len(failed_before)
        # One request per missing item, and one more per answer thrown away (ik can answer a prompt it
        # evaluates whole with end-of-text at once: asked again, never cached).
        assert summary.requests_sent == summary.answered + summary.discarded_answers
        assert {r.id for r in resumed.results if not r.from_cache} == {r.id for r in failed_before}
        # The server's own counters: it generated exactly the answers of the missing items, nothing more.
        assert asked_generated == summary.completion_tokens + summary.discarded_completion_tokens
        assert asked_prompt > 0

        clean = run_batch(server.url, tmp_path / "clean.sqlite3", config, requests, retry=retry)
    assert clean.summary.cache_hits == 0 and clean.summary.failed == 0
    assert [r.id for r in resumed.results] == [r.id for r in clean.results]
    if settings.lanes.cpu_lane.embedded.engine == "llama_cpp":
        # Upstream gave a prompt the same answer at temperature 0 whatever its slot's cache held. ik does not:
        # its batched prompt path (micro-batches of 64+ tokens, Q4_1) gives other logits than one token at a
        # time, so a prompt evaluated whole and one served from the prefix cache can be answered differently.
        assert [r.text for r in resumed.results] == [r.text for r in clean.results]


def test_a_client_killed_mid_batch_loses_nothing_and_the_rerun_asks_only_the_missing(
    cpu_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    """The batch's own process SIGKILLed (no handler runs: the OOM killer, `kill -9`) once some answers are
    committed: every committed answer is kept, and the re-run asks the server for exactly the rest."""
    items, max_tokens, offset = 16, 16, 300
    requests = questions(items, max_tokens, offset)
    cache_path = tmp_path / "killed-client.sqlite3"
    argv = [sys.executable, "-c", BATCH_CLIENT, cpu_server.url, str(cache_path), str(items), str(max_tokens)]
    client_process = subprocess.Popen([*argv, str(offset)], start_new_session=True)
    committed, deadline = 0, time.monotonic() + 300
    try:
        while committed < 3 and client_process.poll() is None and time.monotonic() < deadline:
            if cache_path.exists():
                with ResponseCache(cache_path) as cache:
                    committed = cache.count()
            time.sleep(0.02)
    finally:
        if client_process.poll() is None:
            os.killpg(client_process.pid, signal.SIGKILL)
        client_process.wait(timeout=60)
    assert client_process.returncode == -signal.SIGKILL, (
        f"the client ended (exit {client_process.returncode}) before it was killed, {committed} answers kept"
    )
    with ResponseCache(cache_path) as cache:
        kept = cache.count()
    assert 3 <= kept < items, f"the kill must land mid-batch: {kept} of {items} answers committed"

    with CpuClient(cpu_server.url) as client:
        # What the dead client left running on the server finishes first, so the counters see only the re-run.
        while client.counters().requests_running and time.monotonic() < deadline:
            time.sleep(0.1)
        before = client.counters()
        resumed = run_batch(cpu_server.url, cache_path, batch_config(settings), requests)
        _, asked_generated = client.counters().tokens_since(before)
    summary = resumed.summary
    assert summary.failed == 0, [r.failure for r in resumed.results]
    assert (summary.cache_hits, summary.answered) == (kept, items - kept)
    assert summary.requests_sent == summary.answered + summary.discarded_answers
    assert asked_generated == summary.completion_tokens + summary.discarded_completion_tokens
    assert [r.id for r in resumed.results] == [r.id for r in requests]


@pytest.mark.usefixtures("cpu_engine")
@pytest.mark.parametrize("engine", get_args(CpuEngineName))
def test_a_server_still_loading_is_waited_for(
    settings: Settings, tmp_path: Path, engine: CpuEngineName
) -> None:
    with private_cpu_server(settings_with_cpu_engine(settings, engine), start=False) as server:
        # start() launches the process and blocks until ready; run it beside the client, which starts asking
        # at once, while the process binds its port and loads the model.
        starter = threading.Thread(target=server.start)
        starter.start()
        try:
            with CpuClient(server.url) as client:
                report = client.wait_ready(timeout_s=120, poll_s=0.02)
                result = run_batch(server.url, tmp_path / "c.sqlite3", batch_config(settings), questions(1))
        finally:
            starter.join()
    if engine == "llama_cpp":  # upstream listens at once and answers 503 "Loading model" while it loads
        assert report.loading_answers >= 1, report
    # ik accepts connections at once and answers only once the model is loaded: each poll waits up to
    # POLL_ANSWER_S, so a slow load shows as unanswered polls, a quick one as one slow answer (the bound on
    # the whole wait is the next test's).
    assert result.results[0].status == "ok"


@pytest.mark.usefixtures("cpu_engine")
@pytest.mark.parametrize("engine", get_args(CpuEngineName))
def test_a_server_that_stays_loading_is_a_bounded_wait(settings: Settings, engine: CpuEngineName) -> None:
    with private_cpu_server(settings_with_cpu_engine(settings, engine), start=False) as server:
        starter = threading.Thread(target=server.start)
        starter.start()
        try:
            with (
                CpuClient(server.url) as client,
                pytest.raises(LaneError, match=r"not ready after|unreachable"),
            ):
                client.wait_ready(timeout_s=0.01, poll_s=0.01, connect_grace_s=0.01)
        finally:
            starter.join()


@pytest.mark.usefixtures("cpu_engine")
def test_a_wrong_api_key_is_a_clear_error(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANES_TEST_CPU_KEY", "right-key")
    monkeypatch.setenv("LANES_TEST_WRONG_KEY", "wrong-key")
    keyed = settings_with_cpu_lane(settings, api_key_env="LANES_TEST_CPU_KEY")
    config = batch_config(settings)
    with private_cpu_server(keyed) as server:
        with pytest.raises(AuthenticationError) as error:
            run_batch(server.url, tmp_path / "c.sqlite3", config, questions(2), api_key="wrong-key")
        assert error.value.status_code == 401
        assert "refused the API key" in str(error.value) and "cpu_lane.api_key_env" in str(error.value)
        with pytest.raises(AuthenticationError):  # no key at all
            run_batch(server.url, tmp_path / "c.sqlite3", config, questions(1))
        resource = CpuLaneResource(
            config=CpuLane(
                base_url=server.url,
                api_key_env="LANES_TEST_WRONG_KEY",
                cache_path=str(tmp_path / "r.sqlite3"),
            )
        )
        with pytest.raises(AuthenticationError, match="refused the API key"):
            resource.run_batch(questions(1))
        ok = run_batch(server.url, tmp_path / "c.sqlite3", config, questions(1), api_key="right-key")
    assert ok.results[0].status == "ok"


class _Interrupted(BaseException):
    """What the SIGINT handler raises here: a BaseException, as Dagster's interrupt error and Ctrl-C are."""


def test_a_stopped_batch_returns_at_once_and_sends_nothing_more(
    settings: Settings, cpu_server: EmbeddedServer, tmp_path: Path
) -> None:
    """Ctrl-C (and SIGTERM or SIGHUP, which the commands raise as it; Dagster raises its own interrupt error
    inside a step) mid-batch: `run` raises at once, while the server is still generating the requests in
    flight (it used to wait for them: minutes each on a large model, so `lanes run` outlived a SIGTERM), and
    no request is sent after it. What was answered before the stop is committed."""
    layout = PromptLayout(ASK, shared_context="Counting practice.")
    # Answers of a known length: asked to count, the small model often answers in one line, and a stop
    # between two requests would find none in flight.
    requests = [
        layout.build(f"count{i}", f"Count from {i} to 2000, one number per line.", 200).model_copy(
            update={"ignore_eos": True}
        )
        for i in range(8)
    ]
    metrics = CpuClient(cpu_server.url, timeout_s=10.0)
    answered: list[int] = [0]
    sent_signal = threading.Event()
    finished = threading.Event()

    def interrupt_mid_generation() -> None:
        deadline = time.monotonic() + 120
        while not finished.is_set() and time.monotonic() < deadline:
            if metrics.counters().requests_running >= 1:
                time.sleep(0.5)  # well inside a 200-token answer
                if not finished.is_set():
                    sent_signal.set()
                    os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    def raise_interrupted(signum: int, frame: object) -> None:
        raise _Interrupted

    watcher = threading.Thread(target=interrupt_mid_generation, daemon=True)
    previous = signal.signal(signal.SIGINT, raise_interrupted)
    try:
        with (
            CpuClient(cpu_server.url, timeout_s=120.0, seed=0) as client,
            ResponseCache(tmp_path / "stopped.sqlite3") as cache,
        ):
            watcher.start()
            with pytest.raises(_Interrupted):
                BatchRunner(client, cache, batch_config(settings)).run(
                    requests, progress=lambda p: answered.append(p.answered)
                )
            still_running = metrics.counters().requests_running
            sent_at_stop = client.stats.chat_requests_sent
            finished.set()
            watcher.join(timeout=10)
            assert sent_signal.is_set()
            assert still_running >= 1, "run() waited for the requests in flight"
            deadline = time.monotonic() + 120
            while metrics.counters().requests_running and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)  # a worker that would send next has had time to
            assert client.stats.chat_requests_sent == sent_at_stop
            assert metrics.counters().requests_running == 0
            # Answered before the stop: committed (an answer in flight at the stop may have been committed
            # since). A stopped item is not recorded as failed.
            assert cache.count() >= answered[-1]
            assert cache.failures() == []
    finally:
        finished.set()
        signal.signal(signal.SIGINT, previous)
        metrics.close()

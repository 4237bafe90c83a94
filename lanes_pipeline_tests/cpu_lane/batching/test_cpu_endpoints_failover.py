"""Two real llama-servers as the CPU lane's endpoints, one SIGKILLed mid-batch: every item is answered and
committed exactly once, none is lost, the killed endpoint is reported down and its items in flight are
asked again on the other. No fake servers: both are the embedded server, each on a free port."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lanes_pipeline.cli import main
from lanes_pipeline.cpu_lane.batching.batch import BatchRunner
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.batching.endpoint_pool import CpuEndpointClient, EndpointPool
from lanes_pipeline.http import ChatOutcome, ChatRequest
from lanes_pipeline.settings import RetryPolicy, Settings, project_root
from lanes_pipeline_tests.config_files import read_config, write_config
from lanes_pipeline_tests.cpu_lane.batching.test_cpu_endpoints import CountingCache
from lanes_pipeline_tests.cpu_lane.fixtures import batch_config, private_cpu_server, questions

ITEMS = 24


def _config_check(tmp_path: Path, urls: list[str]) -> str:
    configs = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", configs)
    lanes = read_config(configs / "lanes.yaml")
    lanes["cpu_lane"].pop("base_url", None)
    lanes["cpu_lane"]["endpoints"] = [{"base_url": url, "slots": 2} for url in urls]
    write_config(configs / "lanes.yaml", lanes)
    result = CliRunner().invoke(main, ["config", "check", "--dir", str(configs)])
    assert result.exit_code == 0, result.output
    return result.output


class KilledBeforeSending(CpuClient):
    """The client of server b: once b has answered two items, its next request kills b first, so that
    request (and any other in flight) meets a dead server mid-batch. Killing from the batch's progress
    callback raced the batch: under load b's last item could finish before the kill, and with no item
    sent to b afterwards it was never found down."""

    def __init__(self, server: Any, pool: Callable[[], EndpointPool | None], *args: Any, **kwargs: Any):
        super().__init__(*args, seed=0, **kwargs)
        self.server, self.pool, self._lock = server, pool, threading.Lock()

    def chat_outcome(self, request: ChatRequest) -> ChatOutcome:
        pool = self.pool()
        with self._lock:  # both of b's slots send: one kill
            if self.server.process is not None and pool is not None and pool.live[1].report.answered >= 2:
                self.server.kill()
        return super().chat_outcome(request)


# A drill (two more llama-servers, one killed): the pool's failover rules have fast tests of their own
# (test_cpu_endpoints.py), and the fast tier kills the session's server mid-batch (test_cpu_faults.py).
@pytest.mark.slow
@pytest.mark.usefixtures("cpu_engine")
def test_a_batch_survives_losing_one_of_two_endpoints(settings: Settings, tmp_path: Path) -> None:
    requests = questions(ITEMS, max_tokens=8, offset=300)
    # Few, quick retries: the killed server's items come back to the queue fast.
    retry = RetryPolicy(max_attempts=2, backoff_base_s=0.05, backoff_max_s=0.1)
    with ExitStack() as stack:
        a = stack.enter_context(private_cpu_server(settings))
        b = stack.enter_context(private_cpu_server(settings))
        assert "all config files are valid" in _config_check(tmp_path, [a.url, b.url])  # both llama-servers
        survivor_client = CpuClient(a.url, timeout_s=120.0, retry=retry, seed=0)
        doomed_client = KilledBeforeSending(b, lambda: runner.pool, b.url, timeout_s=120.0, retry=retry)
        endpoints = [CpuEndpointClient(stack.enter_context(c), 2) for c in (survivor_client, doomed_client)]
        cache = stack.enter_context(CountingCache(tmp_path / "answers.sqlite3"))
        runner = BatchRunner(endpoints, cache, batch_config(settings))
        result = runner.run(requests)
        assert b.process is None  # it really was killed mid-batch
        assert runner.pool is not None and runner.pool.live[1].report.answered < ITEMS // 2

        # Every item answered, each committed exactly once, none lost.
        assert [r.status for r in result.results] == ["ok"] * ITEMS, [r.failure for r in result.results]
        assert len(cache.puts) == ITEMS and set(cache.puts.values()) == {1}
        committed = cache.get_many([r.key for r in result.results])
        assert set(committed) == {r.key for r in result.results}
        assert all(committed[r.key].text == r.text for r in result.results)

    by_url = {e.url: e for e in result.endpoints}
    killed, survivor = by_url[b.url], by_url[a.url]
    assert killed.down and not survivor.down
    assert b.url in (killed.reason or "") and "unreachable" in (killed.reason or "")
    # Both took part; the killed one's items in flight were asked again on the other.
    assert killed.answered >= 2 and killed.requeued >= 1
    answered_by = {url: sum(r.endpoint == url for r in result.results) for url in (a.url, b.url)}
    assert answered_by == {a.url: survivor.answered, b.url: killed.answered}
    assert survivor.answered + killed.answered == ITEMS
    # A re-asked item's requests on the killed server count in its figures: nothing hides the re-asking.
    # (An item re-queued before it was sent, claimed for the server as it died, sent nothing there.)
    assert result.summary.requests_sent > ITEMS, (result.summary.requests_sent, killed.requeued)

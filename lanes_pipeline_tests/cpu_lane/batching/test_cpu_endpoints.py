"""Several CPU-lane endpoints, fast: the pure choices (which endpoint, what a failure means, is it a
llama-server), the config rules, and the runner's failover against fake servers.

FAKE SERVERS, on purpose, for the runner tests here: a server that dies after exactly N answers, one that
answers 5xx while its /health fails, two servers with different weights, and the order of slot actions
around a group's first request (with a restore that never answers) are exact on demand only with an
httpx.MockTransport. The failover of a real llama-server SIGKILLed mid-batch is
test_cpu_endpoints_failover.py.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from lanes_pipeline.cli import main
from lanes_pipeline.config.models import CpuLane, LanesConfig, normalised_url
from lanes_pipeline.cpu_lane.batching.answer_cache import CacheEntry, ResponseCache
from lanes_pipeline.cpu_lane.batching.batch import BatchRunner
from lanes_pipeline.cpu_lane.batching.batch_models import BatchConfig, BatchRequest
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.batching.endpoint_check import judge_answers
from lanes_pipeline.cpu_lane.batching.endpoint_choice import (
    AllEndpointsDownError,
    EndpointView,
    after_endpoint_failure,
    choose_endpoint,
)
from lanes_pipeline.cpu_lane.batching.endpoint_pool import CpuEndpointClient
from lanes_pipeline.cpu_lane.batching.slot_copy import NOT_EVERY_SLOT
from lanes_pipeline.cpu_lane.resources import CpuLaneResource, servers_metadata
from lanes_pipeline.deploy.instance import pool_limits
from lanes_pipeline.errors import LaneError
from lanes_pipeline.http import ChatMessage
from lanes_pipeline.settings import ConfigError, RetryPolicy, load_settings, project_root
from lanes_pipeline_tests.config_files import read_config, write_config

# -- the choices -----------------------------------------------------------------------------------------


def test_the_next_item_goes_where_there_is_most_room_relative_to_the_slots() -> None:
    views = [EndpointView(up=True, slots=2, claimed=3), EndpointView(up=True, slots=4, claimed=2)]
    assert choose_endpoint(views) == 1  # 1 of 4 free vs 6 of 8 free
    even = [EndpointView(up=True, slots=2, claimed=1), EndpointView(up=True, slots=2, claimed=1)]
    assert choose_endpoint(even) == 0  # a tie goes to the earlier one
    assert choose_endpoint(even, preferred=1) == 1  # the prefix's server, while it has an idle slot
    busy = [EndpointView(up=True, slots=2, claimed=2), EndpointView(up=True, slots=2, claimed=0)]
    assert choose_endpoint(busy, preferred=0) == 1  # its slots are taken: the other's idle slot


def test_no_room_waits_and_a_down_endpoint_gets_nothing() -> None:
    full = [EndpointView(up=True, slots=2, claimed=4), EndpointView(up=True, slots=1, claimed=2)]
    assert choose_endpoint(full) is None
    views = [EndpointView(up=False, slots=8, claimed=0), EndpointView(up=True, slots=1, claimed=1)]
    assert choose_endpoint(views) == 1
    assert choose_endpoint(views, preferred=0) == 1  # preferred but down: not chosen
    assert choose_endpoint([EndpointView(up=False, slots=2, claimed=0)]) is None


def test_what_a_failed_endpoint_means_for_its_item() -> None:
    assert after_endpoint_failure(configured=1, up_after=0) == "fail_item"  # as before: the gate decides
    assert after_endpoint_failure(configured=2, up_after=1) == "requeue"
    assert after_endpoint_failure(configured=3, up_after=0) == "all_down"


def test_a_llama_server_is_one_that_reports_its_slots() -> None:
    url = "http://h:1"
    assert judge_answers(url, (200, {"total_slots": 2, "n_ctx": 4096}), None).verdict == "llama-server"
    assert judge_answers(url, (404, None), (200, [{"id": 0, "n_ctx": 2048}])).verdict == "llama-server"
    web = judge_answers(url, (404, None), (404, None))
    assert web.verdict == "not a llama-server"
    assert "GET /props answered HTTP 404, GET /slots answered HTTP 404" in web.detail
    other = judge_answers(url, (200, {"name": "vllm"}), (404, None))
    assert other.verdict == "not a llama-server" and "without total_slots" in other.detail
    assert judge_answers(url, (200, [1, 2]), (200, {"x": 1})).verdict == "not a llama-server"
    assert judge_answers(url, (401, None), None).verdict == "refused the key"


# -- the config ------------------------------------------------------------------------------------------


def test_one_server_spelled_two_ways_is_one_server() -> None:
    assert normalised_url("http://LOCALHOST:8081/") == normalised_url("http://127.0.0.1:8081")
    assert normalised_url("http://h") == "http://h:80"
    assert normalised_url("https://h:443/") == "https://h:443"
    assert normalised_url("http://h:8081") != normalised_url("http://h:8082")


def _endpoints(*urls: str, slots: int = 2) -> list[dict[str, object]]:
    return [{"base_url": url, "slots": slots} for url in urls]


def test_endpoints_beside_the_single_base_url() -> None:
    lane = CpuLane.model_validate({"endpoints": _endpoints("http://a:1", "http://b:2/"), "api_key_env": "K"})
    assert lane.base_url == "http://a:1" and not lane.is_embedded  # tools that talk to one server use it
    assert lane.total_slots == 4
    assert [e.api_key_env for e in lane.endpoint_list()] == ["K", "K"]  # the lane's key unless its own
    assert CpuLane.model_validate(lane.model_dump()) == lane  # a dump validates again (Dagster does it)
    single = CpuLane(base_url="http://a:1", max_slots=3)
    assert [(e.base_url, e.slots) for e in single.endpoint_list()] == [("http://a:1", 3)]
    with pytest.raises(ValueError, match="base_url 'http://x:1' and endpoints are both set"):
        CpuLane.model_validate({"base_url": "http://x:1", "endpoints": _endpoints("http://a:1")})
    with pytest.raises(ValueError, match="'embedded' is one bundled server"):
        CpuLane.model_validate({"endpoints": _endpoints("embedded")})
    with pytest.raises(
        ValueError, match=r"cpu_min_in_flight 5 exceeds the sum of cpu_lane\.endpoints' slots 4"
    ):
        LanesConfig.model_validate(
            {
                "cpu_lane": {"endpoints": _endpoints("http://a:1", "http://b:1")},
                "bandwidth": {"cpu_min_in_flight": 5},
            }
        )


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "configs"
    target.mkdir()
    for path in (project_root() / "configs").glob("*.yaml"):
        (target / path.name).write_text(path.read_text())
    monkeypatch.chdir(tmp_path)
    return target


def _set_endpoints(config_dir: Path, endpoints: list[dict[str, object]]) -> None:
    path = config_dir / "lanes.yaml"
    data = read_config(path)
    data["cpu_lane"].pop("base_url", None)
    data["cpu_lane"]["endpoints"] = endpoints
    write_config(path, data)


def test_duplicate_endpoints_are_named_with_their_index(config_dir: Path) -> None:
    _set_endpoints(config_dir, _endpoints("http://localhost:8081", "http://h:2", "http://127.0.0.1:8081/"))
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert [str(issue) for issue in caught.value.issues] == [
        "configs/lanes.yaml: cpu_lane.endpoints: endpoints[2] (http://127.0.0.1:8081) is the same server as "
        "endpoints[0] (http://localhost:8081)"
    ]
    result = CliRunner().invoke(main, ["config", "check", "--dir", str(config_dir)])
    assert result.exit_code == 1 and "endpoints[2]" in result.output and "1 problem(s) found" in result.output


def test_the_cpu_pool_limit_is_the_sum_of_the_endpoints_slots(config_dir: Path) -> None:
    _set_endpoints(
        config_dir, [{"base_url": "http://a:1", "slots": 3}, {"base_url": "http://b:1", "slots": 5}]
    )
    assert pool_limits(load_settings(config_dir)) == {"cpu_lane": 8, "gpu_lane": 1}


@pytest.fixture
def not_a_llama_server() -> Iterator[str]:
    """A real HTTP server that is no llama-server: every path is 404 (a web server on the wrong port)."""

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>Not Found</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_config_check_rejects_an_endpoint_that_is_not_a_llama_server(
    config_dir: Path, not_a_llama_server: str
) -> None:
    # Port 9 (discard) on loopback refuses: not answering now is only noted (a batch fails over from it).
    _set_endpoints(config_dir, _endpoints("http://127.0.0.1:9", not_a_llama_server))
    result = CliRunner().invoke(main, ["config", "check", "--dir", str(config_dir)])
    assert result.exit_code == 1, result.output
    assert "note: cpu_lane.endpoints[0] does not answer now" in result.output
    assert (
        f"configs/lanes.yaml: cpu_lane.endpoints[1].base_url: {not_a_llama_server} answers, but is not a "
        "llama-server: GET /props answered HTTP 404, GET /slots answered HTTP 404"
    ) in result.output
    assert "1 problem(s) found" in result.output and "Traceback" not in result.output


# -- the runner, against fake servers ---------------------------------------------------------------------


class FakeServer:
    """Answers like llama-server; `die_after` completions later every connection is refused, `broken`
    makes completions 502 and /health 503 (a sick server), `model_path` names its weights."""

    def __init__(self, name: str, die_after: int | None = None, model_path: str = "/models/x.gguf") -> None:
        self.name, self.die_after, self.model_path = name, die_after, model_path
        self.dead, self.broken = False, False
        self.completions: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            if self.dead:
                raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/health":
            return httpx.Response(503 if self.broken else 200, json={"status": "ok"})
        if path == "/props":
            return httpx.Response(200, json={"total_slots": 2, "n_ctx": 4096, "model_path": self.model_path})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "smollm2", "meta": {"size": 1}}]})
        body = json.loads(request.content)
        if path == "/apply-template":
            return httpx.Response(200, json={"prompt": " ".join(m["content"] for m in body["messages"])})
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": list(range(len(body["content"].split())))})
        item = body["messages"][-1]["content"]
        with self._lock:
            if self.broken or item == "sick":
                return httpx.Response(502, text="bad gateway")
            if self.die_after is not None and sum(self.completions.values()) >= self.die_after:
                self.dead = True
                raise httpx.ConnectError("connection reset", request=request)
            self.completions[item] += 1
        answer = {"role": "assistant", "content": f"{item} from {self.name}"}
        return httpx.Response(
            200,
            json={
                "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            },
        )


class CountingCache(ResponseCache):
    """The answer cache, counting commits per key: an item committed twice would show here."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.puts: Counter[str] = Counter()

    def put(self, entry: CacheEntry) -> None:
        self.puts[entry.key] += 1
        super().put(entry)


def _endpoint(server: FakeServer) -> CpuEndpointClient:
    url = f"http://{server.name}"
    client = CpuClient(
        url, retry=RetryPolicy(max_attempts=2, backoff_base_s=0.01, backoff_max_s=0.02), seed=0
    )
    client.http = httpx.Client(base_url=url, transport=httpx.MockTransport(server))
    return CpuEndpointClient(client, 2)


def _items(count: int) -> list[BatchRequest]:
    return [
        BatchRequest(id=f"i{n}", messages=[ChatMessage(role="user", content=f"i{n}")]) for n in range(count)
    ]


CONFIG = BatchConfig.of(CpuLane(model="m"), ready_timeout_s=0.3)


def test_a_dead_endpoint_goes_down_and_its_items_are_answered_by_the_other(tmp_path: Path) -> None:
    a, b = FakeServer("a"), FakeServer("b", die_after=2)
    with CountingCache(tmp_path / "c.sqlite3") as cache:
        result = BatchRunner([_endpoint(a), _endpoint(b)], cache, CONFIG).run(_items(16))
        assert [r.status for r in result.results] == ["ok"] * 16
        assert set(cache.puts.values()) == {1} and len(cache.puts) == 16  # each committed exactly once
    by_url = {e.url: e for e in result.endpoints}
    assert by_url["http://b"].down and not by_url["http://a"].down
    assert "http://b" in (by_url["http://b"].reason or "")
    assert by_url["http://b"].answered == 2 and by_url["http://a"].answered == 14
    assert by_url["http://b"].requeued >= 1  # it had items in flight (claimed) when it died
    answered_by = Counter(r.endpoint for r in result.results)
    assert answered_by == {"http://a": 14, "http://b": 2}
    assert all(r.text == f"{r.id} from {(r.endpoint or '').removeprefix('http://')}" for r in result.results)
    metadata = servers_metadata([result])
    assert metadata["cpu_lane/endpoints_down"] == 1 and metadata["cpu_lane/endpoint_0_answered"] == 14


def test_every_endpoint_down_fails_the_batch_naming_them_and_keeps_what_was_committed(tmp_path: Path) -> None:
    a, b = FakeServer("a", die_after=3), FakeServer("b", die_after=2)
    with CountingCache(tmp_path / "c.sqlite3") as cache:
        with pytest.raises(AllEndpointsDownError, match=r"every endpoint is down \(http://a: .*; http://b: "):
            BatchRunner([_endpoint(a), _endpoint(b)], cache, CONFIG).run(_items(12))
        assert len(cache.puts) == 5 and set(cache.puts.values()) == {1}
        assert len(cache.get_many(list(cache.puts))) == 5  # committed, readable after the failure


def test_a_5xx_server_that_fails_its_health_check_goes_down(tmp_path: Path) -> None:
    a, b = FakeServer("a"), FakeServer("b")
    endpoints = [_endpoint(b), _endpoint(a)]  # b first: it gets items
    with ResponseCache(tmp_path / "c.sqlite3") as cache:
        runner = BatchRunner(endpoints, cache, CONFIG)
        b_ready = runner.prepare  # b is healthy while the batch starts, then sickens

        def prepare_then_sicken():  # type: ignore[no-untyped-def]
            pool = b_ready()
            b.broken = True
            return pool

        runner.prepare = prepare_then_sicken  # type: ignore[method-assign]
        result = runner.run(
            [*_items(6), BatchRequest(id="s", messages=[ChatMessage(role="user", content="sick")])]
        )
    by_id = {r.id: r for r in result.results}
    assert all(by_id[f"i{n}"].status == "ok" and by_id[f"i{n}"].endpoint == "http://a" for n in range(6))
    # 5xx from a server whose /health is fine: the item fails, as with one server; nothing goes down for it.
    assert by_id["s"].failure is not None and by_id["s"].failure.kind == "server_error"
    assert [(e.url, e.down) for e in result.endpoints] == [("http://b", True), ("http://a", False)]


def test_an_endpoint_down_before_the_batch_is_reported_and_the_rest_work(tmp_path: Path) -> None:
    a, b = FakeServer("a"), FakeServer("b")
    b.dead = True
    with ResponseCache(tmp_path / "c.sqlite3") as cache:
        result = BatchRunner([_endpoint(b), _endpoint(a)], cache, CONFIG).run(_items(4))
    assert result.summary.ok == 4 and result.server.url == "http://a"
    down = next(e for e in result.endpoints if e.url == "http://b")
    assert down.down and down.answered == 0 and "not ready before the batch" in (down.reason or "")


def test_endpoints_serving_other_weights_are_refused(tmp_path: Path) -> None:
    a, b = FakeServer("a"), FakeServer("b", model_path="/models/other.gguf")
    with ResponseCache(tmp_path / "c.sqlite3") as cache, pytest.raises(LaneError, match="different weights"):
        BatchRunner([_endpoint(a), _endpoint(b)], cache, CONFIG).run(_items(2))


def test_the_resource_builds_a_client_per_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEY_B", "secret-b")
    lane = CpuLane.model_validate(
        {
            "endpoints": [
                {"base_url": "http://a:1", "slots": 3},
                {"base_url": "http://b:1", "slots": 1, "api_key_env": "KEY_B"},
            ]
        }
    )
    clients = CpuLaneResource(config=lane).endpoint_clients()
    assert [(c.client.base_url, c.slots) for c in clients] == [("http://a:1", 3), ("http://b:1", 1)]
    assert clients[1].client.http.headers.get("authorization") == "Bearer secret-b"
    assert clients[0].client.http.headers.get("authorization") is None
    for c in clients:
        c.client.close()


# -- copying a group's prefix between slots ----------------------------------------------------------------


class SlotFileServer(FakeServer):
    """A FakeServer with slot files; `restore_hangs`: a restore never answers (what ik 0.1.5 does when a
    restore fails, which a real server does only for a file the runner never asks it to restore)."""

    def __init__(self, restore_hangs: bool = False, others_in_flight: int = 0, total_slots: int = 2) -> None:
        super().__init__("s")
        self.restore_hangs, self.total_slots = restore_hangs, total_slots
        self.others_in_flight = others_in_flight  # another client's requests, as /metrics counts them
        self.events: list[str] = []  # slot actions and completions, in the order the server saw them

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/metrics":
            counters = {"requests_processing": self.others_in_flight, "requests_deferred": 0}
            counters |= {"prompt_tokens_total": 0, "tokens_predicted_total": 0}
            return httpx.Response(200, text="".join(f"llamacpp:{k} {v}\n" for k, v in counters.items()))
        if path == "/props":
            props = {"total_slots": self.total_slots, "n_ctx": 4096, "model_path": self.model_path}
            return httpx.Response(200, json=props)
        if path.startswith("/slots/"):
            action, slot = request.url.params["action"], int(path.rsplit("/", 1)[1])
            self.events.append(f"{action} {slot}")
            if action == "restore" and self.restore_hangs:
                raise httpx.ReadTimeout("timed out", request=request)
            count = {"save": "n_saved", "restore": "n_restored", "erase": "n_erased"}[action]
            return httpx.Response(200, json={"id_slot": slot, "filename": "f", count: 300})
        if path == "/v1/chat/completions":
            body = json.loads(request.content)
            self.events.append(f"chat {body['messages'][-1]['content'][-2:]} slot {body.get('id_slot')}")
        return super().__call__(request)


def _group(count: int) -> list[BatchRequest]:
    prefix = "a repo map " * 20
    return [
        BatchRequest(
            id=f"g{n}", messages=[ChatMessage(role="user", content=f"{prefix}q{n}")], varying_from=len(prefix)
        )
        for n in range(count)
    ]


def test_the_first_of_a_group_runs_in_a_pinned_slot_copied_to_the_other_first(tmp_path: Path) -> None:
    server = SlotFileServer()
    with ResponseCache(tmp_path / "c.sqlite3") as cache:
        result = BatchRunner([_endpoint(server)], cache, CONFIG).run(_group(4))
    assert [r.status for r in result.results] == ["ok"] * 4
    # Every slot emptied first, so the file is restored into an empty cache (no run of free cells too short)
    copy = ["save 0", "erase 0", "erase 1", "restore 0", "restore 1"]
    assert server.events[:6] == ["chat q0 slot 0", *copy]
    assert sorted(server.events[6:]) == ["chat q1 slot None", "chat q2 slot None", "chat q3 slot None"]
    assert result.endpoints[0].slot_copies == 1 and result.summary.prefix_slot_copies == 1


def test_no_copy_is_made_while_another_client_runs_on_the_server(tmp_path: Path) -> None:
    """Its cells interleave with the leader's and can leave no room for a restore, which ik never answers."""
    server = SlotFileServer(others_in_flight=1)
    with ResponseCache(tmp_path / "c.sqlite3") as cache:
        result = BatchRunner([_endpoint(server)], cache, CONFIG).run(_group(4))
    assert [r.status for r in result.results] == ["ok"] * 4
    assert not [e for e in server.events if not e.startswith("chat")]  # no slot action at all
    (endpoint,) = result.endpoints
    assert (endpoint.slot_copies, endpoint.slot_copies_skipped, endpoint.slot_copy_off) == (0, 1, None)


def test_no_copy_is_made_on_a_server_with_slots_the_batch_does_not_use(tmp_path: Path) -> None:
    server = SlotFileServer(total_slots=3)  # the batch uses 2: the third slot's cache stays where it is
    with ResponseCache(tmp_path / "c.sqlite3") as cache:
        result = BatchRunner([_endpoint(server)], cache, CONFIG).run(_group(4))
    assert [r.status for r in result.results] == ["ok"] * 4
    assert not [e for e in server.events if not e.startswith("chat")]
    assert result.endpoints[0].slot_copy_off == NOT_EVERY_SLOT


def test_a_restore_that_never_answers_is_bounded_and_turns_copies_off_for_the_batch(tmp_path: Path) -> None:
    server = SlotFileServer(restore_hangs=True)  # the client's timeout, as it ends the call
    with ResponseCache(tmp_path / "c.sqlite3") as cache:
        result = BatchRunner([_endpoint(server)], cache, CONFIG).run(_group(4))
    assert [r.status for r in result.results] == ["ok"] * 4  # the group still fans out and is answered
    (endpoint,) = result.endpoints
    assert endpoint.slot_copies == 0
    assert endpoint.slot_copy_off is not None and endpoint.slot_copy_off.startswith("slot copy failed: ")
    assert "POST /slots/0" in endpoint.slot_copy_off  # the request that did not answer (the source first)
    assert servers_metadata([result])["cpu_lane/slot_copy_off"] == endpoint.slot_copy_off

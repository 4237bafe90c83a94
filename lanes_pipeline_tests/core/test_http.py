"""Retries of the base client (`http.OpenAIClient`) and its typed errors.

FAKE SERVER, on purpose: a 408, a 429 with Retry-After, a 5xx that then heals, and a connection dropped
without an answer cannot be made to happen on demand on a real llama-server or vLLM. This small HTTP server
(a real socket, so httpx's transport is exercised as in production) answers each path with a script.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lanes_pipeline.errors import (
    AuthenticationError,
    BadRequestError,
    InternalServerError,
    LaneConnectionError,
    LaneStatusError,
    NotImplementedStatusError,
    RateLimitedError,
    RequestTimeoutError,
    status_error,
)
from lanes_pipeline.http import ChatMessage, ChatRequest, OpenAIClient, retry_after_s
from lanes_pipeline.settings import CpuLane, GpuLane, RetryPolicy

ANSWER = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
# path -> the statuses of its first answers (then 200); "drop" closes the connection without an answer.
SCRIPTS: dict[str, list[int | str]] = {
    "/408": [408, 408],
    "/429": [429],
    "/5xx": [500, 503],
    "/400": [400, 400],
    "/401": [401],
    "/501": [501],
    "/always-502": [502] * 10,
    "/drop": ["drop"],
    "/v1/chat/completions": [503],
}


class FaultServer:
    def __init__(self, retry_after: str = "0.3") -> None:
        self.hits: Counter[str] = Counter()
        self.retry_after = retry_after
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                outer.hits[self.path] += 1
                script = SCRIPTS.get(self.path, [])
                step = script[outer.hits[self.path] - 1] if outer.hits[self.path] <= len(script) else 200
                if step == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)  # no status line at all: a transport error
                    return
                body = json.dumps(ANSWER if step == 200 else {"error": {"message": f"scripted {step}"}})
                self.send_response(int(step))
                if step == 429:
                    self.send_header("Retry-After", outer.retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> FaultServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


FAST = RetryPolicy(max_attempts=3, backoff_base_s=0.01, backoff_max_s=2.0)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with FaultServer() as running:
        yield running


def _client(url: str, policy: RetryPolicy = FAST) -> OpenAIClient:
    return OpenAIClient("CPU", url, retry=policy, seed=0, timeout_s=5.0)


def test_408_is_retried_until_it_answers(server: FaultServer) -> None:
    with _client(server.url) as client:
        response = client.expect_ok(client.request("GET", "/408"))
    assert response.status_code == 200 and server.hits["/408"] == 3
    assert (client.stats.requests_sent, client.stats.retries) == (3, 2)


def test_429_waits_as_long_as_retry_after_says(server: FaultServer) -> None:
    with _client(server.url) as client:
        started = time.monotonic()
        client.expect_ok(client.request("GET", "/429"))
        waited = time.monotonic() - started
    assert server.hits["/429"] == 2
    assert 0.3 <= waited < 1.5, waited  # the server's 0.3 s, not the 0.01 s backoff
    assert client.stats.waited_s == pytest.approx(0.3)


def test_retry_after_is_capped_by_backoff_max() -> None:
    with FaultServer(retry_after="120") as server:
        policy = RetryPolicy(max_attempts=2, backoff_base_s=0.01, backoff_max_s=0.2)
        with _client(server.url, policy) as client:
            started = time.monotonic()
            client.expect_ok(client.request("GET", "/429"))
            assert time.monotonic() - started < 2.0
        assert client.stats.waited_s == pytest.approx(0.2)


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert retry_after_s("7") == 7.0
    assert retry_after_s(format_datetime(now + timedelta(seconds=30), usegmt=True), now=now) == 30.0
    assert retry_after_s(format_datetime(now - timedelta(seconds=30), usegmt=True), now=now) == 0.0
    assert retry_after_s(None) is None and retry_after_s("soon") is None


def test_5xx_is_retried_then_the_chat_answers(server: FaultServer) -> None:
    with _client(server.url) as client:
        assert client.expect_ok(client.request("GET", "/5xx")).status_code == 200
        chat = client.chat_outcome(ChatRequest(model="m", messages=[ChatMessage(role="user", content="x")]))
    assert server.hits["/5xx"] == 3 and chat.response.text == "hi" and chat.attempts == 2
    assert client.stats.chat_requests_sent == 2 and client.stats.requests_sent == 5


def test_400_and_401_are_never_retried_and_typed(server: FaultServer) -> None:
    with _client(server.url) as client:
        with pytest.raises(BadRequestError) as bad:
            client.expect_ok(client.request("POST", "/400", json={}))
        with pytest.raises(AuthenticationError, match=r"refused the API key.*cpu_lane\.api_key_env"):
            client.expect_ok(client.request("GET", "/401"))
        with pytest.raises(NotImplementedStatusError):  # 501: the server lacks the feature
            client.expect_ok(client.request("GET", "/501"))
    assert server.hits["/400"] == 1 and server.hits["/401"] == 1 and server.hits["/501"] == 1
    error = bad.value
    assert (error.status, error.lane, error.method, error.url, error.attempts) == (
        400,
        "CPU",
        "POST",
        "/400",
        1,
    )
    assert "POST /400 answered HTTP 400" in str(error) and server.url in str(error)
    assert client.stats.retries == 0


def test_retries_are_bounded_and_counted_in_the_error(server: FaultServer) -> None:
    with _client(server.url) as client, pytest.raises(InternalServerError) as error:
        client.expect_ok(client.request("GET", "/always-502"))
    assert server.hits["/always-502"] == 3 and error.value.attempts == 3
    assert "after 3 attempts" in str(error.value)


def test_a_dropped_connection_is_retried(server: FaultServer) -> None:
    with _client(server.url) as client:
        assert client.expect_ok(client.request("GET", "/drop")).status_code == 200
    assert server.hits["/drop"] == 2 and client.stats.retries == 1


def test_nothing_listening_is_a_connection_error_after_the_attempts() -> None:
    with FaultServer() as server:
        url = server.url
    with _client(url) as client, pytest.raises(LaneConnectionError, match="after 3 attempts") as error:
        client.request("GET", "/v1/models")
    assert error.value.attempts == 3 and client.stats.requests_sent == 3


def test_one_attempt_when_asked(server: FaultServer) -> None:
    with _client(server.url) as client:
        assert client.request("GET", "/5xx", retries=False).status_code == 500
    assert server.hits["/5xx"] == 1


def test_status_errors_by_class() -> None:
    kinds = {
        code: type(status_error(code, "GPU", "http://x", "GET", "/p", "")) for code in (403, 408, 429, 599)
    }
    assert kinds == {
        403: AuthenticationError,
        408: RequestTimeoutError,
        429: RateLimitedError,
        599: InternalServerError,
    }
    assert type(status_error(418, "GPU", "http://x", "GET", "/p", "")) is LaneStatusError
    assert status_error(401, "GPU", "http://x", "GET", "/p", "").status_code == 401


def test_both_lanes_take_the_policy_from_their_config() -> None:
    cpu = CpuLane(max_attempts=7, backoff_base_s=0.5, backoff_max_s=4)
    assert OpenAIClient("CPU", "http://x", retry=cpu).retry == RetryPolicy(
        max_attempts=7, backoff_base_s=0.5, backoff_max_s=4
    )
    assert GpuLane(max_attempts=2).retry_policy().max_attempts == 2
    assert OpenAIClient("GPU", "http://x").retry == RetryPolicy()

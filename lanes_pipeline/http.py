"""The OpenAI-compatible wire format both lanes speak, as pydantic models, and a small typed client.

llama-server / ik_llama.cpp and vLLM both answer `/v1/chat/completions`; each lane's own client
(`cpu_lane/batching/client.py`, `gpu_lane/client.py`) builds on `OpenAIClient` for what only its server has.
Both also answer `/v1/completions` (a plain text continuation: the code-completion figure asks it).

`OpenAIClient.request` retries what a second try can fix (transport errors, timeouts, 408, 429, 5xx) with
exponential backoff and jitter, honouring a 429/503's `Retry-After`; it never retries another 4xx. Each
client counts what it sent (`stats`), so "a re-run asks the server nothing" stays provable.
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.errors import (
    LaneConnectionError,
    LaneStatusError,
    LaneTimeoutError,
    is_retryable_status,
    status_error,
)
from lanes_pipeline.settings import LaneConnection, RetryPolicy

CONNECTION_DEFAULTS = LaneConnection()


class WireModel(BaseModel):
    # Servers add fields over time; a response model must not break on them.
    model_config = ConfigDict(extra="allow")


class ChatMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[ChatMessage]
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0)
    seed: int | None = 0
    stop: list[str] | None = None
    response_format: dict[str, Any] | None = None
    grammar: str | None = None  # GBNF (llama-server, ik_llama.cpp); never together with response_format
    ignore_eos: bool | None = None  # llama-server: generate past end-of-text, to a stop string or max_tokens
    # llama-server: the slot to run in. Only one the server has: an unknown slot is deferred forever.
    id_slot: int | None = Field(None, ge=0)
    # vLLM: end a generation whose last tokens repeat a pattern (`max_pattern_size`, `min_pattern_size`,
    # `min_count`) instead of running to max_tokens; servers without it ignore the field.
    repetition_detection: dict[str, int] | None = None

    def payload(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class PromptTokensDetails(WireModel):
    cached_tokens: int | None = None


class Usage(WireModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class Timings(WireModel):
    """llama-server's own timing block (vLLM has none: the client measures wall time instead)."""

    prompt_n: int | None = None
    prompt_ms: float | None = None
    prompt_per_second: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    cache_n: int | None = None


class ChatChoiceMessage(WireModel):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(WireModel):
    index: int = 0
    message: ChatChoiceMessage
    finish_reason: str | None = None


class ChatResponse(WireModel):
    id: str = ""
    model: str = ""
    choices: list[ChatChoice]
    usage: Usage = Usage()
    timings: Timings | None = None

    @property
    def text(self) -> str:
        return self.choices[0].message.content or "" if self.choices else ""


class CompletionRequest(BaseModel):
    """A plain text continuation (`/v1/completions`): what an editor sends for code completion, the file's
    text before the cursor as `prompt` (no chat template)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str
    max_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0)
    seed: int | None = 0
    stop: list[str] | None = None

    def payload(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class CompletionChoice(WireModel):
    index: int = 0
    text: str = ""
    finish_reason: str | None = None


class CompletionResponse(WireModel):
    id: str = ""
    model: str = ""
    choices: list[CompletionChoice]
    usage: Usage = Usage()

    @property
    def text(self) -> str:
        return self.choices[0].text if self.choices else ""


class ModelCard(WireModel):
    id: str
    root: str | None = None
    parent: str | None = None


class ModelList(WireModel):
    data: list[ModelCard]


def backoff_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with jitter before retry number `attempt` (1-based): a random point in the
    upper half of min(cap, base * 2^(attempt-1)), so retries of many requests spread out but still wait."""
    ceiling = min(cap_s, base_s * 2 ** (attempt - 1))
    return ceiling / 2 + rng.random() * ceiling / 2


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """A `Retry-After` header in seconds: delta-seconds or an HTTP date (RFC 9110); None if absent or bad."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


@dataclass
class ClientStats:
    """What one client sent: every HTTP attempt, retries included, and how many were chat completions."""

    requests_sent: int = 0
    retries: int = 0
    chat_requests_sent: int = 0
    waited_s: float = 0.0  # total backoff sleep
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, path: str, retry: bool) -> None:
        with self._lock:
            self.requests_sent += 1
            self.retries += retry
            self.chat_requests_sent += path == CHAT_PATH

    def slept(self, seconds: float) -> None:
        with self._lock:
            self.waited_s += seconds


CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


@dataclass(frozen=True)
class Sent:
    """A response and what it took: attempts made, and the wall time of the attempt that answered."""

    response: httpx.Response
    attempts: int
    latency_s: float


@dataclass(frozen=True)
class ChatOutcome:
    response: ChatResponse
    attempts: int
    latency_s: float


NO_RETRY = RetryPolicy(max_attempts=1)


class OpenAIClient:
    """A lane's HTTP client: one httpx.Client, the API-key header, bounded retries, and typed errors that
    name the lane, the method and the URL."""

    def __init__(
        self,
        lane: str,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
        seed: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        keep_alive: bool = True,
    ) -> None:
        """`retry`: the lane's policy (its config model is one); None takes RetryPolicy's defaults, and a
        timeout of None a lane connection's (LaneConnection: the settings' defaults, declared there once).
        `seed` makes the jitter reproducible; `sleep` is what waits between attempts. `keep_alive: False`
        closes each connection after its answer, for a server with few HTTP threads."""
        self.lane, self.base_url = lane, base_url.rstrip("/")
        self.retry = retry.retry_policy() if retry is not None else RetryPolicy()
        self.stats = ClientStats()
        self._rng, self._rng_lock, self._sleep = random.Random(seed), threading.Lock(), sleep
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(
                timeout_s if timeout_s is not None else CONNECTION_DEFAULTS.request_timeout_s,
                connect=connect_timeout_s
                if connect_timeout_s is not None
                else CONNECTION_DEFAULTS.connect_timeout_s,
            ),
            limits=httpx.Limits() if keep_alive else httpx.Limits(max_keepalive_connections=0),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, retries: bool = True, **kwargs: Any) -> httpx.Response:
        """One request, retried per the policy (`retries=False`: one attempt, for polls that are their own
        retry). Returns the last response whatever its status (callers read 404/501/503 themselves; use
        `expect_ok` for typed errors); raises LaneConnectionError / LaneTimeoutError when nothing answered."""
        return self.send(method, path, retries=retries, **kwargs).response

    def send(self, method: str, path: str, *, retries: bool = True, **kwargs: Any) -> Sent:
        attempts = self.retry.max_attempts if retries else 1
        for attempt in range(1, attempts + 1):
            self.stats.count(path, retry=attempt > 1)
            started = time.perf_counter()
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if attempt == attempts:
                    error = (
                        LaneTimeoutError if isinstance(exc, httpx.TimeoutException) else LaneConnectionError
                    )
                    cause = f"{type(exc).__name__}: {exc}"
                    raise error(self.lane, self.base_url, method, path, cause, attempt) from exc
                self._wait(attempt, None)
                continue
            if is_retryable_status(response.status_code) and attempt < attempts:
                self._wait(attempt, response.headers.get("retry-after"))
                continue
            response.extensions["lanes_attempts"] = attempt
            return Sent(response, attempt, time.perf_counter() - started)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _wait(self, attempt: int, retry_after: str | None) -> None:
        """Sleep before retry `attempt`: the server's Retry-After (capped), else backoff with jitter."""
        told = retry_after_s(retry_after)
        if told is not None:
            delay = min(told, self.retry.backoff_max_s)
        else:
            with self._rng_lock:
                delay = backoff_delay(attempt, self.retry.backoff_base_s, self.retry.backoff_max_s, self._rng)
        self.stats.slept(delay)
        self._sleep(delay)

    def expect_ok(self, response: httpx.Response) -> httpx.Response:
        """The response, or its typed LaneStatusError (which names the lane, method, URL and attempts)."""
        if response.status_code < 400:
            return response
        raise self.status_error(response)

    def status_error(self, response: httpx.Response) -> LaneStatusError:
        attempts = int(response.extensions.get("lanes_attempts", 1))
        return status_error(
            response.status_code,
            self.lane,
            self.base_url,
            response.request.method,
            response.request.url.path,
            response.text,
            attempts,
        )

    def metrics_text(self) -> str:
        """GET /metrics as Prometheus text: both servers serve it (llama-server with `--metrics`)."""
        return self.expect_ok(self.request("GET", "/metrics")).text

    def models(self) -> ModelList:
        return ModelList.model_validate(self.expect_ok(self.request("GET", "/v1/models")).json())

    def chat(self, request: ChatRequest) -> ChatResponse:
        return self.chat_outcome(request).response

    def chat_outcome(self, request: ChatRequest) -> ChatOutcome:
        """The answer, the attempts it took, and the latency of the attempt that answered."""
        sent = self.send("POST", CHAT_PATH, json=request.payload())
        response = ChatResponse.model_validate(self.expect_ok(sent.response).json())
        return ChatOutcome(response, sent.attempts, sent.latency_s)

    def completion(self, request: CompletionRequest) -> CompletionResponse:
        """A text continuation, with the same retries and typed errors as `chat`."""
        sent = self.send("POST", COMPLETIONS_PATH, json=request.payload())
        return CompletionResponse.model_validate(self.expect_ok(sent.response).json())

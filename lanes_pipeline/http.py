"""The OpenAI-compatible wire format both lanes speak, as pydantic models, and a small typed client.

llama-server / ik_llama.cpp and vLLM both answer `/v1/chat/completions`; each lane's own client
(`cpu.py`, `gpu.py`) builds on `OpenAIClient` for what only its server has.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.errors import LaneError, LaneUnreachableError


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


class ModelCard(WireModel):
    id: str
    root: str | None = None
    parent: str | None = None


class ModelList(WireModel):
    data: list[ModelCard]


class OpenAIClient:
    """A lane's HTTP client: one httpx.Client, the API-key header, and errors that name the lane and URL."""

    def __init__(
        self,
        lane: str,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.lane, self.base_url = lane, base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise LaneUnreachableError(
                self.lane, self.base_url, f"{method} {self.base_url}{path}", f"{type(exc).__name__}: {exc}"
            ) from exc

    def expect_ok(self, response: httpx.Response) -> httpx.Response:
        if response.status_code in (401, 403):
            raise LaneError(
                f"{self.lane} lane at {self.base_url} refused the API key "
                f"({response.request.method} {response.request.url.path}: HTTP {response.status_code}); "
                f"check {self.lane.lower()}_lane.api_key_env in configs/lanes.yaml"
            )
        if response.status_code >= 400:
            raise LaneError(
                f"{self.lane} lane at {self.base_url}: {response.request.method} {response.request.url.path} "
                f"answered HTTP {response.status_code}: {response.text[:500]}"
            )
        return response

    def models(self) -> ModelList:
        return ModelList.model_validate(self.expect_ok(self.request("GET", "/v1/models")).json())

    def chat(self, request: ChatRequest) -> ChatResponse:
        response = self.expect_ok(self.request("POST", "/v1/chat/completions", json=request.payload()))
        return ChatResponse.model_validate(response.json())

"""One chat request to a lane, with the figures users judge a lane by: tokens/s and latency."""

from __future__ import annotations

import time

from pydantic import BaseModel

from lanes_pipeline.http import ChatMessage, ChatRequest, OpenAIClient

PROBE_PROMPT = "Write a one-line Python function that returns the square of x."


class ProbeResult(BaseModel):
    lane: str
    model: str
    answer: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    # Server-measured where the server reports it (llama-server's `timings`), else wall-clock over the
    # whole request, which understates generation speed by the prompt time: said in `speed_source`.
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float
    speed_source: str


def probe(client: OpenAIClient, model: str, prompt: str = PROBE_PROMPT, max_tokens: int = 48) -> ProbeResult:
    request = ChatRequest(
        model=model, messages=[ChatMessage(role="user", content=prompt)], max_tokens=max_tokens, temperature=0
    )
    started = time.perf_counter()
    response = client.chat(request)
    latency = time.perf_counter() - started
    timings = response.timings
    if timings is not None and timings.predicted_per_second:
        gen_tps, prompt_tps, source = (
            timings.predicted_per_second,
            timings.prompt_per_second,
            "server timings",
        )
    else:
        gen_tps = response.usage.completion_tokens / latency if latency > 0 else 0.0
        prompt_tps, source = None, "client wall clock"
    return ProbeResult(
        lane=client.lane,
        model=model,
        answer=response.text.strip(),
        prompt_tokens=response.usage.prompt_tokens,
        completion_tokens=response.usage.completion_tokens,
        latency_s=round(latency, 3),
        prompt_tokens_per_s=round(prompt_tps, 1) if prompt_tps else None,
        generation_tokens_per_s=round(gen_tps, 1),
        speed_source=source,
    )

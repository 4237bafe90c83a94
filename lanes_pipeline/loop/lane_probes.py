"""One chat request to each lane per materialization, with the figures users judge a lane by: tokens/s and
latency, plotted over time in the UI, so a slower build, a changed flag or a bandwidth fight between the
lanes shows up as a dip."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
import time
from typing import Any

from dagster import AssetExecutionContext, Failure, MaterializeResult, MetadataValue, asset
from pydantic import BaseModel

from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.errors import LaneError
from lanes_pipeline.gpu_lane.resources import GpuLaneResource
from lanes_pipeline.http import ChatMessage, ChatRequest, OpenAIClient
from lanes_pipeline.steps import asset_step

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


def _result(result: ProbeResult, url: str) -> MaterializeResult:
    return MaterializeResult(
        metadata={
            "url": MetadataValue.url(url),
            "model": result.model,
            "answer": MetadataValue.md(f"```\n{result.answer}\n```"),
            "generation_tokens_per_s": result.generation_tokens_per_s,
            "prompt_tokens_per_s": result.prompt_tokens_per_s or 0.0,
            "latency_s": result.latency_s,
            "completion_tokens": result.completion_tokens,
            "speed_source": result.speed_source,
        }
    )


def _endpoint_figures(index: int, url: str, result: ProbeResult | None, error: str | None) -> dict[str, Any]:
    prefix = f"endpoint_{index}"
    if result is None:
        return {f"{prefix}/url": MetadataValue.url(url), f"{prefix}/down": str(error)}
    return {
        f"{prefix}/url": MetadataValue.url(url),
        f"{prefix}/generation_tokens_per_s": result.generation_tokens_per_s,
        f"{prefix}/prompt_tokens_per_s": result.prompt_tokens_per_s or 0.0,
        f"{prefix}/latency_s": result.latency_s,
    }


@asset(
    group_name="lanes",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    description="One chat request to each server of the CPU lane: tok/s, latency.",
)
@asset_step
def cpu_lane_probe(context: AssetExecutionContext, cpu_lane: CpuLaneResource) -> MaterializeResult:
    """With several servers (`cpu_lane.endpoints`) each is asked, so one box that slowed down shows in its
    own `endpoint_<i>/...` figures; one that does not answer is named (`endpoint_<i>/down`) and the probe
    fails only when none answers (a batch goes on with the others, too). The top-level figures are the
    first answering server's."""
    answered: list[tuple[str, ProbeResult]] = []
    down: list[str] = []
    figures: dict[str, Any] = {}
    endpoints = cpu_lane.endpoint_clients()
    for index, endpoint in enumerate(endpoints):
        with endpoint.client as client:
            try:
                result = probe(client, cpu_lane.config.model_alias)
            except LaneError as exc:
                if len(endpoints) == 1:
                    raise
                context.log.warning(f"CPU lane endpoint {index} ({client.base_url}) did not answer: {exc}")
                figures |= _endpoint_figures(index, client.base_url, None, str(exc))
                down.append(f"{client.base_url}: {exc}")
                continue
        answered.append((client.base_url, result))
        figures |= _endpoint_figures(index, client.base_url, result, None) if len(endpoints) > 1 else {}
        context.log.info(
            f"CPU lane at {client.base_url} answered at {result.generation_tokens_per_s} tok/s: "
            f"{result.answer[:80]!r}"
        )
    if not answered:
        raise Failure(f"no CPU-lane endpoint answered the probe ({'; '.join(down)})")
    url, first = answered[0]
    probed = _result(first, url)
    return MaterializeResult(metadata={**(probed.metadata or {}), **figures})


@asset(
    group_name="lanes",
    pool="gpu_lane",
    retry_policy=LANE_RETRY,
    description="One chat request to the GPU lane: tok/s, latency.",
)
@asset_step
def gpu_lane_probe(context: AssetExecutionContext, gpu_lane: GpuLaneResource) -> MaterializeResult:
    with gpu_lane.client() as client:
        result = probe(client, gpu_lane.config.served_model_name)
    context.log.info(f"GPU lane answered at {result.generation_tokens_per_s} tok/s: {result.answer[:80]!r}")
    return _result(result, gpu_lane.url)

"""One chat request to each lane per materialization: tokens/s and latency plotted over time in the UI,
so a slower build, a changed flag or a bandwidth fight between the lanes shows up as a dip."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.resource import CpuLaneResource
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.gpu_lane.resources import GpuLaneResource
from lanes_pipeline.host import with_host_figures
from lanes_pipeline.probe import ProbeResult, probe


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


@asset(
    group_name="lanes",
    pool="cpu_lane",
    retry_policy=LANE_RETRY,
    description="One chat request to the CPU lane: tok/s, latency.",
)
@with_host_figures
def cpu_lane_probe(context: AssetExecutionContext, cpu_lane: CpuLaneResource) -> MaterializeResult:
    with cpu_lane.client() as client:
        result = probe(client, cpu_lane.config.model_alias)
    context.log.info(f"CPU lane answered at {result.generation_tokens_per_s} tok/s: {result.answer[:80]!r}")
    return _result(result, cpu_lane.url)


@asset(
    group_name="lanes",
    pool="gpu_lane",
    retry_policy=LANE_RETRY,
    description="One chat request to the GPU lane: tok/s, latency.",
)
@with_host_figures
def gpu_lane_probe(context: AssetExecutionContext, gpu_lane: GpuLaneResource) -> MaterializeResult:
    with gpu_lane.client() as client:
        result = probe(client, gpu_lane.config.served_model_name)
    context.log.info(f"GPU lane answered at {result.generation_tokens_per_s} tok/s: {result.answer[:80]!r}")
    return _result(result, gpu_lane.url)

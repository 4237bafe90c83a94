"""The daily lane benchmark, beside the lane probes: both lanes on the fixed workload and their interference,
every figure a number in metadata so the Plots tab shows its trend over the days."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from typing import Literal

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import PipelineSettingsResource
from lanes_pipeline.gpu_lane.resources import GpuLaneResource
from lanes_pipeline.observatory.benchmark import lane_target, run_benchmark
from lanes_pipeline.observatory.workload import WORKLOADS
from lanes_pipeline.steps import asset_step


class LaneBenchmarksConfig(Config):
    # small by default: the daily run of a two-core machine stays bounded; a workstation sets `default`.
    workload: Literal["default", "small"] = "small"


@asset(
    group_name="lanes",
    pool="cpu_lane",  # not beside the CPU lane's batch steps: they would be measured as interference
    retry_policy=LANE_RETRY,
    description="Both lanes on a fixed workload: TTFT, prompt/generation tok/s, p50/p95, prefix-cache hits, "
    "KV use, PF, and how much each lane slows the other (CPU yielding off and on).",
)
@asset_step
def lane_benchmarks(
    context: AssetExecutionContext,
    config: LaneBenchmarksConfig,
    cpu_lane: CpuLaneResource,
    gpu_lane: GpuLaneResource,
    pipeline_settings: PipelineSettingsResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    cpu = lane_target(settings, "cpu", cpu_lane.url)
    gpu = lane_target(settings, "gpu", gpu_lane.url)
    result = run_benchmark(cpu, gpu, WORKLOADS[config.workload], settings.lanes.bandwidth)
    context.log.info(f"lane benchmark:\n{result.markdown()}")
    return MaterializeResult(
        metadata={
            **result.metadata(),
            "workload": config.workload,
            "table": MetadataValue.md(result.markdown()),
        }
    )

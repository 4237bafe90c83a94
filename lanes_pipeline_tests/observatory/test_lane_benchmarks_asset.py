"""The daily `lane_benchmarks` asset against both real lanes (slow: vLLM), on the small workload: every
figure of both lanes and of their interference lands in metadata as a number the Plots tab charts."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, RunConfig, materialize

from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.resources import PipelineSettingsResource
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.gpu_lane.resources import GpuLaneResource
from lanes_pipeline.observatory.assets import LaneBenchmarksConfig, lane_benchmarks
from lanes_pipeline.settings import CpuLane, GpuLane


@pytest.mark.slow
def test_lane_benchmarks_materializes_every_figure(
    cpu_server: EmbeddedServer, gpu_server: EmbeddedServer
) -> None:
    result = materialize(
        [lane_benchmarks],
        resources={
            "cpu_lane": CpuLaneResource(config=CpuLane(base_url=cpu_server.url)),
            "gpu_lane": GpuLaneResource(config=GpuLane(base_url=gpu_server.url)),
            "pipeline_settings": PipelineSettingsResource(),
        },
        run_config=RunConfig({"lane_benchmarks": LaneBenchmarksConfig(workload="small")}),
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    metadata = {
        k: v.value for k, v in result.asset_materializations_for_node("lane_benchmarks")[0].metadata.items()
    }
    for lane in ("cpu_lane", "gpu_lane"):
        for figure in ("ttft_s", "prompt_tok_s", "generation_tok_s", "generation_tok_s_slots", "p95_s", "pf"):
            assert metadata[f"{lane}/{figure}"] > 0, (lane, figure, metadata)  # type: ignore[operator]
    assert metadata["gpu_lane/engine"] == "vllm" and 0 <= metadata["gpu_lane/prefix_hit"] <= 1  # type: ignore[operator]
    for ratio in ("cpu_ratio", "gpu_ratio_yield_off", "gpu_ratio_yield_on"):
        assert metadata[f"interference/{ratio}"] > 0  # type: ignore[operator]

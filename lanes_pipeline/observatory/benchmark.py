"""The lane benchmark: both lanes measured on the same fixed workload, then their interference. Shared by
the daily asset `lane_benchmarks`, `lanes bench lanes` and the trials."""

from __future__ import annotations

from pydantic import BaseModel

from lanes_pipeline.observatory.interference import InterferenceFigures, measure_interference
from lanes_pipeline.observatory.measure import LaneFigures, LaneTarget, measure_lane
from lanes_pipeline.observatory.workload import Workload
from lanes_pipeline.settings import BandwidthConfig, Settings

# vLLM has no slot count of its own in lanes.yaml: the editor's few concurrent requests.
GPU_LANE_IN_FLIGHT = 2


class LaneBenchmark(BaseModel):
    cpu: LaneFigures | None = None
    gpu: LaneFigures | None = None
    interference: InterferenceFigures | None = None

    def metadata(self) -> dict[str, float | int | str]:
        """Every figure as a flat number, so the Plots tab charts each over days."""
        out: dict[str, float | int | str] = {}
        for lane in (self.cpu, self.gpu):
            if lane is not None:
                out |= lane.metadata(f"{lane.lane}_lane")
        if self.interference is not None:
            out |= self.interference.metadata()
        return out

    def markdown(self) -> str:
        lines = ["| figure | CPU lane | GPU lane |", "|---|---|---|"]
        names = [n for n in LaneFigures.model_fields if n not in ("lane",)]
        for name in names:
            values = [getattr(lane, name) if lane else None for lane in (self.cpu, self.gpu)]
            shown = ["-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)) for v in values]
            lines.append(f"| {name} | {shown[0]} | {shown[1]} |")
        if self.interference is not None:
            i = self.interference
            lines += [
                "",
                f"Interference (with / alone, generation tok/s): CPU lane beside GPU load {i.cpu_ratio:.2f}; "
                f"GPU lane beside CPU load, yielding off {i.gpu_ratio_yield_off:.2f}, "
                f"on {i.gpu_ratio_yield_on:.2f} ({i.cpu_yields} yields)",
            ]
        return "\n".join(lines)


def lane_target(settings: Settings, lane: str, url: str) -> LaneTarget:
    """A lane as configured in lanes.yaml (its served name, its slots, its model's active parameters)."""
    if lane == "cpu":
        config = settings.lanes.cpu_lane
        name, slots = config.model_alias, config.max_slots
    else:
        gpu = settings.lanes.gpu_lane
        config, name, slots = gpu, gpu.served_model_name, GPU_LANE_IN_FLIGHT
    entry = settings.models.get(config.model)
    return LaneTarget(
        lane="cpu" if lane == "cpu" else "gpu",
        url=url,
        model=name,
        slots=slots,
        active_params_b=entry.active_params_b or entry.params_b,
        api_key=config.api_key(),
    )


def run_benchmark(
    cpu: LaneTarget | None, gpu: LaneTarget | None, work: Workload, policy: BandwidthConfig
) -> LaneBenchmark:
    """Each lane alone, then (when both are there) the interference between them."""
    result = LaneBenchmark(
        cpu=measure_lane(cpu, work) if cpu else None,
        gpu=measure_lane(gpu, work) if gpu else None,
    )
    if cpu is not None and gpu is not None:
        result = result.model_copy(update={"interference": measure_interference(cpu, gpu, work, policy)})
    return result

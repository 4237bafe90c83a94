"""How much one lane slows the other: each lane's generation tokens/s on a fixed load, alone and while the
other lane runs a background load, as ratios (1.0 = no slowdown). The CPU lane's background load runs twice,
yielding off (the memory bus itself) and on (the yield governor of metrics/bandwidth.py caps it while vLLM
is busy): the difference is what yielding buys the GPU lane.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from lanes_pipeline.config.models import BandwidthConfig
from lanes_pipeline.metrics.bandwidth import GpuYieldGovernor
from lanes_pipeline.observatory.measure import LaneTarget, load_bodies, run_load
from lanes_pipeline.observatory.workload import Workload


class InterferenceFigures(BaseModel):
    """Generation tokens/s of each lane's fixed load, alone and beside the other lane's load."""

    model_config = ConfigDict(frozen=True)

    cpu_alone: float
    cpu_with_gpu: float
    gpu_alone: float
    gpu_with_cpu_yield_off: float
    gpu_with_cpu_yield_on: float
    cpu_yields: int  # times the governor stepped the CPU lane back during the yield-on run

    @property
    def cpu_ratio(self) -> float:
        return ratio(self.cpu_with_gpu, self.cpu_alone)

    @property
    def gpu_ratio_yield_off(self) -> float:
        return ratio(self.gpu_with_cpu_yield_off, self.gpu_alone)

    @property
    def gpu_ratio_yield_on(self) -> float:
        return ratio(self.gpu_with_cpu_yield_on, self.gpu_alone)

    def for_lane(self, lane: str) -> float:
        """The one figure a trial's table shows: its lane beside the other lane's load, yielding off."""
        return self.cpu_ratio if lane == "cpu" else self.gpu_ratio_yield_off

    def metadata(self) -> dict[str, float | int]:
        figures = {**self.model_dump(), "cpu_ratio": self.cpu_ratio}
        figures |= {
            "gpu_ratio_yield_off": self.gpu_ratio_yield_off,
            "gpu_ratio_yield_on": self.gpu_ratio_yield_on,
        }
        return {f"interference/{k}": round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}


def ratio(with_other: float, alone: float) -> float:
    return with_other / alone if alone > 0 else 0.0


def _fixed_load(target: LaneTarget, work: Workload, offset: int) -> float:
    bodies = load_bodies(target, target.slots * work.interference_requests_per_slot, work.max_tokens, offset)
    return run_load(target, bodies, target.slots).generation_tok_s


def _beside(
    measured: LaneTarget,
    other: LaneTarget,
    work: Workload,
    offset: int,
    cap: Callable[[], int | None] | None = None,
) -> float:
    """The measured lane's fixed load while the other lane loops its own load at its slots."""
    stop = threading.Event()
    background_bodies = load_bodies(other, other.slots * 2, work.max_tokens, offset + 100)
    background = threading.Thread(
        target=run_load, args=(other, background_bodies, other.slots, cap, stop), daemon=True
    )
    background.start()
    try:
        return _fixed_load(measured, work, offset)
    finally:
        stop.set()
        background.join(timeout=300)  # requests in flight finish; nothing new is sent


def measure_interference(
    cpu: LaneTarget, gpu: LaneTarget, work: Workload, policy: BandwidthConfig
) -> InterferenceFigures:
    cpu_alone = _fixed_load(cpu, work, 0)
    gpu_alone = _fixed_load(gpu, work, 0)
    cpu_with_gpu = _beside(cpu, gpu, work, 10)
    gpu_off = _beside(gpu, cpu, work, 20)
    governor = GpuYieldGovernor(gpu.url, policy, gpu.api_key).start()
    try:
        gpu_on = _beside(gpu, cpu, work, 30, cap=governor.cap)
    finally:
        governor.stop()
    return InterferenceFigures(
        cpu_alone=cpu_alone,
        cpu_with_gpu=cpu_with_gpu,
        gpu_alone=gpu_alone,
        gpu_with_cpu_yield_off=gpu_off,
        gpu_with_cpu_yield_on=gpu_on,
        cpu_yields=governor.report().yields,
    )

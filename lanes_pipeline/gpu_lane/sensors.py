"""Sensors. `gpu_lane_adapters_sensor`: a restarted vLLM has lost every runtime adapter; put them back.

It acts in the tick itself rather than launching a run: loading two or three adapters takes seconds, and a
run could wait behind a training run in the gpu_lane pool for hours while editors get 404s for the alias.
"""

from dagster import DefaultSensorStatus, SensorEvaluationContext, SkipReason, sensor

from lanes_pipeline.daily.resources import LoraTrainingResource
from lanes_pipeline.errors import AliasMoveInProgressError, LaneError
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource, service_for

RESTORE_INTERVAL_S = 30


@sensor(
    name="gpu_lane_adapters_sensor",
    minimum_interval_seconds=RESTORE_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="Registers the adapter alias and the recent versions again when vLLM has restarted.",
)
def gpu_lane_adapters_sensor(
    context: SensorEvaluationContext,
    gpu_lane: GpuLaneResource,
    adapter_registry: AdapterRegistryResource,
    lora_training: LoraTrainingResource,
) -> SkipReason:
    url = gpu_lane.running_url()
    if url is None:
        return SkipReason("the embedded GPU lane is not running; nothing to restore")
    try:
        with gpu_lane.vllm(url) as client:
            if not client.health():
                return SkipReason(f"GPU lane at {url} is not healthy yet; will try again")
            service = service_for(gpu_lane, adapter_registry, lora_training, client)
            restored = service.restore(wait_for_move=False)
    except AliasMoveInProgressError as exc:  # a promotion between vLLM's move and its record: not a drift
        return SkipReason(f"{exc}; the next tick checks {gpu_lane.alias_name} again")
    except LaneError as exc:  # down between the health check and the loads: the next tick retries
        context.log.warning(f"restoring adapters on {url} failed: {exc}")
        return SkipReason(f"restoring adapters on {url} failed; will try again: {exc}")
    if not restored:
        return SkipReason(f"{gpu_lane.alias_name} is served at {url} (or was never set)")
    context.log.info(f"vLLM at {url} had restarted: registered {', '.join(restored)} again")
    return SkipReason(f"restored {', '.join(restored)} at {url}")


SENSORS = [gpu_lane_adapters_sensor]

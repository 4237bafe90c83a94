"""Jobs. Each is listed in JOBS, which definitions.py registers; add new jobs there."""

from dagster import (
    AssetSelection,
    OpExecutionContext,
    define_asset_job,
    job,
    op,
)

from lanes_pipeline.daily.policies import LANE_RETRY
from lanes_pipeline.daily.resources import LoraTrainingResource
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource, service_for


@op(description="Move the GPU lane's adapter alias back to the previous promoted version.")
def rollback_adapter_alias(
    context: OpExecutionContext,
    gpu_lane: GpuLaneResource,
    adapter_registry: AdapterRegistryResource,
    lora_training: LoraTrainingResource,
) -> str:
    with gpu_lane.vllm() as client:
        report = service_for(gpu_lane, adapter_registry, lora_training, client).rollback()
    context.log.info(f"{report.alias} -> {report.version} ({report.path}) in {report.seconds:.2f} s")
    return report.version


@job(description="Roll the GPU lane's adapter alias back to the previous promoted version (seconds).")
def rollback_adapter_job() -> None:
    rollback_adapter_alias()


# The daily loop: one run per day materializes the whole graph for that day's partition. Whatever asset
# lands in the code location is in it (AssetSelection.all(), with its checks); the unpartitioned lane probes
# run in every run, so their tokens/s plot over the days. The lane assets carry LANE_RETRY themselves (so
# backfill runs retry too); here it also covers every other step of the job.
DAILY_JOB_TAG = "lanes/job"
# The lane benchmark loads both lanes for minutes to measure them: it has a daily job of its own rather than
# riding in every daily_lanes run (and every day of a backfill), where it would slow the day's batch work.
LANE_BENCHMARKS = AssetSelection.assets("lane_benchmarks")

daily_lanes_job = define_asset_job(
    name="daily_lanes",
    selection=AssetSelection.all() - LANE_BENCHMARKS,
    description="The day's whole pipeline: the CPU lane's batch work over the repositories, the LoRA "
    "dataset, then the adapter trained, judged and served on the GPU lane.",
    run_tags={DAILY_JOB_TAG: "daily_lanes"},
    op_retry_policy=LANE_RETRY,
)

lane_benchmarks_job = define_asset_job(
    name="lane_benchmarks_daily",
    selection=LANE_BENCHMARKS,
    description="Both lanes on the fixed workload and their interference (the observatory's daily figures).",
    op_retry_policy=LANE_RETRY,
)

JOBS = [rollback_adapter_job, daily_lanes_job, lane_benchmarks_job]

"""Assembles the code location: resources, assets, checks, jobs, schedules, sensors. Nothing else.

Nothing is read at import: Dagster calls `defs()` when it loads the code location (`@definitions`), and the
daily partitions, the schedule and the resources are built then from the configs.
"""

from __future__ import annotations

from dagster import (
    AssetsDefinition,
    Definitions,
    colored_console_logger,
    definitions,
    load_assets_from_modules,
    multiprocess_executor,
)

from lanes_pipeline.cpu_lane.assets import (
    accepted_work,
    generated_docs,
    generated_tests,
    refactor_proposals,
    repo_analysis,
    repo_snapshot,
    review_branch,
    verified_bodies,
)
from lanes_pipeline.cpu_lane.checks import build_checks
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.partitions import daily_partitions, partitioned_daily
from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.dataset import assets as dataset
from lanes_pipeline.dataset.checks import build_dataset_checks
from lanes_pipeline.gpu_lane import assets as gpu_lane
from lanes_pipeline.gpu_lane.checks import build_gpu_checks
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource
from lanes_pipeline.gpu_lane.sensors import SENSORS
from lanes_pipeline.loop import lane_probes
from lanes_pipeline.loop.jobs import JOBS
from lanes_pipeline.loop.lineage import with_training_window
from lanes_pipeline.loop.progress import TERMINAL_LOGGER, terminal_logger
from lanes_pipeline.loop.schedules import daily_schedule, lane_benchmarks_schedule
from lanes_pipeline.observatory import assets as observatory
from lanes_pipeline.settings import Settings, load_settings

# Every step in a process of its own (a crashed or killed step takes nothing else down), forked from a
# server that has imported the code location once: a spawned step imported it afresh, about 2 s a step and
# some 20 steps a day on 2 cores.
STEP_EXECUTOR = multiprocess_executor.configured(
    {"start_method": {"forkserver": {"preload_modules": ["lanes_pipeline.definitions"]}}},
    name="multiprocess_forkserver",
)

# The lane assets, one partition per day; the lane probes are not partitioned (they run in every run).
# The CPU lane's day (its review branch among it) and the dataset it feeds: what a day materializes before
# the GPU lane.
CPU_DAY_MODULES = [
    repo_snapshot,
    repo_analysis,
    generated_tests,
    generated_docs,
    refactor_proposals,
    verified_bodies,
    accepted_work,
    review_branch,
    dataset,
]
DAILY_MODULES = [*CPU_DAY_MODULES, gpu_lane]


def daily_assets(settings: Settings) -> dict[str, AssetsDefinition]:
    """Every daily lane asset by name, on the configured partitions (tests materialize them directly)."""
    assets = partitioned_daily(load_assets_from_modules(DAILY_MODULES), daily_partitions(settings))  # type: ignore[arg-type]
    assets = with_training_window(assets, settings.training.replay_window_days)
    return {asset.key.to_user_string(): asset for asset in assets}


def build_definitions(settings: Settings) -> Definitions:
    return Definitions(
        assets=[*load_assets_from_modules([lane_probes, observatory]), *daily_assets(settings).values()],
        asset_checks=[
            *build_checks(daily_partitions(settings)),
            *build_dataset_checks(daily_partitions(settings)),
            *build_gpu_checks(daily_partitions(settings)),
        ],
        jobs=JOBS,
        executor=STEP_EXECUTOR,
        schedules=[daily_schedule(settings), lane_benchmarks_schedule(settings)],
        sensors=SENSORS,
        # Dagster's console logger, as every job has by default, and `lanes run`'s terminal, in that order (a
        # step's error prints before the terminal's line about it): a run whose config names neither (the
        # daemon's) logs to the console as before (loop/progress.py).
        loggers={"console": colored_console_logger, TERMINAL_LOGGER: terminal_logger},
        resources={
            "cpu_lane": CpuLaneResource.from_lanes(settings.lanes),
            "gpu_lane": GpuLaneResource.from_config(
                settings.lanes.gpu_lane, bandwidth=settings.lanes.bandwidth, cpu=settings.lanes.cpu_lane
            ),
            "artifact_store": ArtifactStoreResource(),
            "pipeline_settings": PipelineSettingsResource(),
            "adapter_registry": AdapterRegistryResource(),
            "lora_training": LoraTrainingResource.from_config(settings.training),
        },
    )


@definitions
def defs() -> Definitions:
    return build_definitions(load_settings())

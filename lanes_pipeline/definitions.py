"""Assembles the code location: resources, assets, checks, jobs, schedules, sensors. Nothing else."""

from __future__ import annotations

from dagster import Definitions, load_assets_from_modules

from lanes_pipeline.assets import analysis, gpu_lane, lane_probes, lora_dataset, refactor, snapshot, testgen
from lanes_pipeline.checks import CHECKS
from lanes_pipeline.jobs import JOBS
from lanes_pipeline.resources.adapter_registry import AdapterRegistryResource
from lanes_pipeline.resources.artifact_store import ArtifactStoreResource
from lanes_pipeline.resources.cpu_lane import CpuLaneResource
from lanes_pipeline.resources.gpu_lane import GpuLaneResource
from lanes_pipeline.resources.lora_training import LoraTrainingResource
from lanes_pipeline.resources.pipeline_settings import PipelineSettingsResource
from lanes_pipeline.schedules import daily_schedule
from lanes_pipeline.sensors import SENSORS
from lanes_pipeline.settings import Settings, load_settings


def build_definitions(settings: Settings) -> Definitions:
    return Definitions(
        assets=load_assets_from_modules(
            [lane_probes, snapshot, analysis, testgen, refactor, lora_dataset, gpu_lane]
        ),
        asset_checks=CHECKS,
        jobs=JOBS,
        schedules=[daily_schedule(settings)],
        sensors=SENSORS,
        resources={
            "cpu_lane": CpuLaneResource.from_config(
                settings.lanes.cpu_lane, bandwidth=settings.lanes.bandwidth, gpu=settings.lanes.gpu_lane
            ),
            "gpu_lane": GpuLaneResource.from_config(
                settings.lanes.gpu_lane, bandwidth=settings.lanes.bandwidth, cpu=settings.lanes.cpu_lane
            ),
            "artifact_store": ArtifactStoreResource(),
            "pipeline_settings": PipelineSettingsResource(),
            "adapter_registry": AdapterRegistryResource(),
            "lora_training": LoraTrainingResource.from_config(settings.training),
        },
    )


defs = build_definitions(load_settings())

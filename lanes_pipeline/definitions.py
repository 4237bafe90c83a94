"""Assembles the code location: resources, assets, checks, jobs, schedules, sensors. Nothing else."""

from __future__ import annotations

from dagster import Definitions, load_assets_from_modules

from lanes_pipeline.cpu_lane.assets import analysis, refactor, snapshot
from lanes_pipeline.cpu_lane.assets import dataset as lora_dataset
from lanes_pipeline.cpu_lane.assets import tests as testgen
from lanes_pipeline.cpu_lane.checks import CHECKS
from lanes_pipeline.cpu_lane.resource import CpuLaneResource
from lanes_pipeline.daily import lane_probes
from lanes_pipeline.daily.jobs import JOBS
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.daily.schedules import daily_schedule
from lanes_pipeline.gpu_lane import assets as gpu_lane
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource, LoraTrainingResource
from lanes_pipeline.gpu_lane.sensors import SENSORS
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

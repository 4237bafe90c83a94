"""The CPU lane's settings: declared once (the resource holds the config models themselves, through a
Dagster run too), and one failure gate (`cpu_lane.max_failure_ratio`; the old `cpu_assets` key is reported
unknown)."""

# No `from __future__ import annotations`: Dagster reads the asset's resource annotation at definition time.
import shutil
from pathlib import Path

from click.testing import CliRunner
from dagster import DagsterInstance, asset, materialize

from lanes_pipeline.cli.config import config
from lanes_pipeline.cpu_lane.resources import CpuLaneResource, over_failure_ratio
from lanes_pipeline.settings import BandwidthConfig, CpuLane, load_settings, project_root
from lanes_pipeline_tests.config_files import read_config, write_config


def test_a_config_with_the_removed_failure_gate_names_file_and_key(tmp_path: Path) -> None:
    config_dir = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", config_dir)
    pipeline = read_config(config_dir / "pipeline.yaml")
    pipeline["cpu_assets"]["max_failure_ratio"] = 0.25  # the second gate, removed: cpu_lane's is the one
    write_config(config_dir / "pipeline.yaml", pipeline)
    result = CliRunner().invoke(config, ["check", "--dir", str(config_dir)])
    assert result.exit_code == 1
    assert f"{config_dir / 'pipeline.yaml'}: cpu_assets.max_failure_ratio: unknown key" in result.stderr
    assert "1 problem(s) found" in result.stderr


def test_the_resource_holds_the_lanes_config_models(tmp_path: Path) -> None:
    settings = load_settings()
    resource = CpuLaneResource.from_lanes(settings.lanes, base_url="http://127.0.0.1:9")
    assert resource.config == settings.lanes.cpu_lane.model_copy(update={"base_url": "http://127.0.0.1:9"})
    assert resource.bandwidth == settings.lanes.bandwidth and resource.gpu == settings.lanes.gpu_lane
    batch = resource.batch_config()
    assert (batch.model_alias, batch.configured_model, batch.max_slots, batch.overflow) == (
        settings.lanes.cpu_lane.model_alias,
        settings.lanes.cpu_lane.model,
        settings.lanes.cpu_lane.max_slots,
        settings.lanes.cpu_lane.overflow,
    )
    assert resource.retry_policy() == settings.lanes.cpu_lane.retry_policy()
    assert resource.bandwidth == settings.lanes.bandwidth

    # Through a Dagster run (the resource's config goes through Dagster's config system and back).
    lane = CpuLane(base_url="http://127.0.0.1:9", cache_path=str(tmp_path / "c.sqlite3"), max_slots=3)
    seen: dict[str, object] = {}

    @asset
    def reads_the_lane(cpu_lane: CpuLaneResource) -> None:
        seen.update(config=cpu_lane.config, bandwidth=cpu_lane.bandwidth, url=cpu_lane.url)

    resources = {"cpu_lane": CpuLaneResource(config=lane, bandwidth=BandwidthConfig(yield_to_gpu=False))}
    result = materialize([reads_the_lane], resources=resources, instance=DagsterInstance.ephemeral())
    assert result.success
    assert seen == {"config": lane, "bandwidth": BandwidthConfig(yield_to_gpu=False), "url": lane.base_url}


def test_the_failure_gate_allows_up_to_the_ratio() -> None:
    assert not over_failure_ratio(1, 2, 0.5) and over_failure_ratio(1, 2, 0.25)
    assert not over_failure_ratio(0, 0, 0.0)  # nothing asked, nothing failed

"""The code location loads: `dagster definitions validate` passes and every asset resolves."""

from __future__ import annotations

import os
import subprocess
import sys

from lanes_pipeline.definitions import defs as load_defs
from lanes_pipeline.settings import project_root


def test_dagster_definitions_validate_passes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=project_root(),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DAGSTER_HOME": ""},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All code locations passed validation" in result.stdout + result.stderr


def test_assets_and_resources_resolve() -> None:
    repository = load_defs().get_repository_def()
    keys = {key.to_user_string() for key in repository.asset_graph.get_all_asset_keys()}
    assert {"cpu_lane_probe", "gpu_lane_probe"} <= keys
    assert {"cpu_lane", "gpu_lane", "artifact_store"} <= set(load_defs().resources or {})

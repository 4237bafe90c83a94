"""The validated configuration as a Dagster resource: assets read `configs/*.yaml` at run time through it,
so a test (or a second deployment) points it at another config folder without touching the environment."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource

from lanes_pipeline.settings import Settings, load_settings


class PipelineSettingsResource(ConfigurableResource):
    config_dir: str = ""  # empty: LANES_CONFIG_DIR, else the project's configs/

    def load(self) -> Settings:
        return load_settings(Path(self.config_dir) if self.config_dir else None)

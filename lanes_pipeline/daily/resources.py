"""Resources every asset shares: the artifact store (the one place assets write to) and the validated
configuration (read at run time, so a test points it at another config folder without touching the
environment)."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource

from lanes_pipeline.settings import Settings, data_dir, load_settings
from lanes_pipeline.store import ArtifactStore


class ArtifactStoreResource(ConfigurableResource):
    root: str = ""  # empty: <data dir>/artifacts

    def store(self) -> ArtifactStore:
        return ArtifactStore(Path(self.root) if self.root else data_dir() / "artifacts")


class PipelineSettingsResource(ConfigurableResource):
    config_dir: str = ""  # empty: LANES_CONFIG_DIR, else the project's configs/

    def load(self) -> Settings:
        return load_settings(Path(self.config_dir) if self.config_dir else None)

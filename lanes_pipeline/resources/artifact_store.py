"""The artifact store as a Dagster resource: the one place assets write to."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource

from lanes_pipeline.settings import data_dir
from lanes_pipeline.store import ArtifactStore


class ArtifactStoreResource(ConfigurableResource):
    root: str = ""  # empty: <data dir>/artifacts

    def store(self) -> ArtifactStore:
        return ArtifactStore(Path(self.root) if self.root else data_dir() / "artifacts")

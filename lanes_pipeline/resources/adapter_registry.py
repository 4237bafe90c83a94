"""The adapter version registry and the adapter folders, as a Dagster resource."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource

from lanes_pipeline.adapters import AdapterRegistry
from lanes_pipeline.settings import data_dir

REGISTRY_FILE = "registry.sqlite"


class AdapterRegistryResource(ConfigurableResource):
    adapters_dir: str = ""  # empty: <data dir>/adapters

    def folder(self) -> Path:
        folder = Path(self.adapters_dir) if self.adapters_dir else data_dir() / "adapters"
        return folder.resolve()  # vLLM needs absolute paths

    def registry(self) -> AdapterRegistry:
        return AdapterRegistry(self.folder() / REGISTRY_FILE)

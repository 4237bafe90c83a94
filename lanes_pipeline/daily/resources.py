"""Resources every asset shares: the artifact store (the one place assets write to), the validated
configuration (read at run time, so a test points it at another config folder without touching the
environment), and the training settings with the base model (the dataset shapes rows for the model the
GPU lane trains, with its tokenizer and its max sequence length)."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource

from lanes_pipeline.embedded import engines
from lanes_pipeline.settings import EMBEDDED, Settings, TrainingConfig, data_dir, load_settings
from lanes_pipeline.store import ArtifactStore


class ArtifactStoreResource(ConfigurableResource):
    root: str = ""  # empty: <data dir>/artifacts

    def store(self) -> ArtifactStore:
        return ArtifactStore(Path(self.root) if self.root else data_dir() / "artifacts")


class PipelineSettingsResource(ConfigurableResource):
    config_dir: str = ""  # empty: LANES_CONFIG_DIR, else the project's configs/

    def load(self) -> Settings:
        return load_settings(Path(self.config_dir) if self.config_dir else None)


class LoraTrainingResource(ConfigurableResource):
    """configs/training.yaml, nested as the config model itself (the launchpad can override any key of it
    for one run): every setting and its default is declared once, in `TrainingConfig`."""

    training: TrainingConfig = TrainingConfig()

    @classmethod
    def from_config(cls, config: TrainingConfig) -> LoraTrainingResource:
        return cls(training=config)

    def config(self) -> TrainingConfig:
        return self.training

    def base_model_path(self) -> Path:
        """The HF folder to train on; `embedded` is the converted SmolLM2 (converted on first use)."""
        base = self.config().base_model_dir
        if base == EMBEDDED:
            return engines.embedded_hf_model(data_dir()).resolve()
        return Path(base).resolve()

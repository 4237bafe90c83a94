"""Where a configured repository is on this machine: its own path, or the shipped sample for `embedded`."""

from __future__ import annotations

from pathlib import Path

from lanes_pipeline.repos.sample_repo import EMBEDDED_REPO, ensure_sample_repo
from lanes_pipeline.settings import RepoEntry, Settings


def repo_location(settings: Settings, entry: RepoEntry) -> Path:
    """The git repository of a config entry; `embedded` is the shipped sample, built on first use."""
    if entry.path == EMBEDDED_REPO:
        return ensure_sample_repo(settings.data_dir / "sample_repo")
    return settings.repo_path(entry)

"""Where a configured repository is on this machine: its own path, or the shipped sample for `embedded`;
and repo_snapshot's day with each repository's place, as the day's assets read it."""

from __future__ import annotations

from pathlib import Path

from lanes_pipeline.repos.sample_repo import EMBEDDED_REPO, ensure_sample_repo
from lanes_pipeline.repos.snapshot import Snapshot, load_snapshots
from lanes_pipeline.settings import RepoEntry, Settings
from lanes_pipeline.store import ArtifactStore


def repo_location(settings: Settings, entry: RepoEntry) -> Path:
    """The git repository of a config entry; `embedded` is the shipped sample, built on first use."""
    if entry.path == EMBEDDED_REPO:
        return ensure_sample_repo(settings.data_dir / "sample_repo")
    return settings.repo_path(entry)


def located_snapshots(store: ArtifactStore, day: str, settings: Settings) -> list[tuple[Snapshot, Path]]:
    """Each repository of repo_snapshot's day, with where the repository is."""
    entries = {e.name: e for e in settings.repos.repos}
    return [(s, repo_location(settings, entries[s.repo])) for s in load_snapshots(store, day)]

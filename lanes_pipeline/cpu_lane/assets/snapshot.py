"""`repo_snapshot`: each configured repository as it was at the end of day D (commit chosen by date, so a
backfill sees the past), its file inventory, what changed since the day before, what was left out and why,
and the repo map that becomes the shared prompt prefix of every CPU-lane task."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from datetime import date

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.assets.common import md_table, repo_location, write_partition
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.host import with_host_figures
from lanes_pipeline.repos.snapshot import SelectionRules, take_snapshot


@asset(
    group_name="cpu_lane",
    description="Each repository at the end of the day: commit, inventory, changes, left-out files, map.",
)
@with_host_figures
def repo_snapshot(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    day = date.fromisoformat(context.partition_key)
    snapshots = []
    for entry in settings.repos.repos:
        rules = SelectionRules(
            include=entry.include,
            exclude=entry.exclude,
            max_file_bytes=settings.pipeline.cpu_assets.max_file_bytes,
        )
        snapshot = take_snapshot(
            entry.name,
            repo_location(settings, entry),
            entry.branch,
            day,
            settings.pipeline.timezone,
            rules,
            settings.pipeline.cpu_assets.repo_map_chars,
        )
        context.log.info(
            f"{entry.name} at {day}: commit {snapshot.commit or '(none yet)'}, {len(snapshot.files)} files, "
            f"{len(snapshot.changed)} changed, {len(snapshot.left_out)} left out"
        )
        snapshots.append(snapshot)
    content_hash = write_partition(
        artifact_store.store(),
        "repo_snapshot",
        context.partition_key,
        {"snapshots.json": [s.model_dump(mode="json") for s in snapshots]},
    )
    left_out = [(s.repo, f.path, f.reason, f.detail) for s in snapshots for f in s.left_out]
    return MaterializeResult(
        metadata={
            "repos": len(snapshots),
            "files": sum(len(s.files) for s in snapshots),
            "changed_files": sum(len(s.changed) for s in snapshots),
            "deleted_files": sum(len(s.deleted) for s in snapshots),
            "left_out_files": len(left_out),
            "commits": MetadataValue.json({s.repo: s.commit for s in snapshots}),
            "left_out": md_table(["repo", "path", "reason", "detail"], left_out),
            "repo_map": MetadataValue.md("\n\n".join(f"```\n{s.repo_map}\n```" for s in snapshots)),
            "artifact_hash": content_hash,
        }
    )

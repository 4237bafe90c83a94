"""`repo_snapshot`: each configured repository as it was at the end of day D (commit chosen by date, so a
backfill sees the past), its file inventory, what changed since the day before, what was left out and why,
and the repo map that becomes the shared prompt prefix of every CPU-lane task. `day_symbols`: the symbols
of that commit the CPU-lane jobs work on that day (day_selection.py)."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from datetime import date

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.jobs.backlog import DayWork
from lanes_pipeline.cpu_lane.jobs.day_selection import DAY_SYMBOLS, SELECTION_FILE, select_day
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.daily.artifacts import md_table, write_partition
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.repos.location import located_snapshots, repo_location
from lanes_pipeline.repos.snapshot import SelectionRules, take_snapshot
from lanes_pipeline.steps import asset_step


@asset(
    group_name="cpu_lane",
    description="Each repository at the end of the day: commit, inventory, changes, left-out files, map.",
)
@asset_step
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
    redacted = [(s.repo, path, ", ".join(kinds)) for s in snapshots for path, kinds in s.redactions().items()]
    return MaterializeResult(
        metadata={
            "repos": len(snapshots),
            "files": sum(len(s.files) for s in snapshots),
            "changed_files": sum(len(s.changed) for s in snapshots),
            "deleted_files": sum(len(s.deleted) for s in snapshots),
            "left_out_files": len(left_out),
            "commits": MetadataValue.json({s.repo: s.commit for s in snapshots}),
            "left_out": md_table(["repo", "path", "reason", "detail"], left_out),
            # Values redacted in prompts (types only): "N values redacted in F files".
            "redacted_values": sum(len(kinds.split(", ")) for _, _, kinds in redacted),
            "redacted_files": len(redacted),
            "redacted": md_table(["repo", "path", "types of the values redacted"], redacted),
            "repo_map": MetadataValue.md("\n\n".join(f"```\n{s.repo_map}\n```" for s in snapshots)),
            "artifact_hash": content_hash,
        }
    )


@asset(
    group_name="cpu_lane",
    deps=[repo_snapshot],
    description="The day's symbols of each repository that every CPU-lane job works on: new and changed "
    "since the day before first, then up to backlog_per_day never covered, most referenced first.",
)
@asset_step
def day_symbols(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    store = artifact_store.store()
    register = Memo(store, "tests_register")
    chosen: dict[str, DayWork] = {}
    rows = []
    for snapshot, location in located_snapshots(store, context.partition_key, settings):
        if snapshot.commit is None:
            continue
        selection = select_day(register, snapshot, location, settings.pipeline.cpu_assets.backlog_per_day)
        work = chosen[snapshot.repo] = selection.chosen
        rows.append(
            (
                snapshot.repo,
                len(selection.today.symbols),
                len(work.changed),
                len(work.backlog),
                work.remaining,
            )
        )
    content_hash = write_partition(
        store,
        DAY_SYMBOLS,
        context.partition_key,
        {SELECTION_FILE: {repo: work.model_dump(mode="json") for repo, work in chosen.items()}},
    )
    return MaterializeResult(
        metadata={
            "symbols_chosen": sum(len(w.ids) for w in chosen.values()),
            "changed_symbols": sum(len(w.changed) for w in chosen.values()),
            "backlog_symbols": sum(len(w.backlog) for w in chosen.values()),
            "chosen": md_table(["repo", "symbols", "changed", "from the backlog", "backlog left"], rows),
            "artifact_hash": content_hash,
        }
    )

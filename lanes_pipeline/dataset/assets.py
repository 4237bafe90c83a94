"""The dataset's daily assets, between the lanes.

`held_out_tasks`: each repository's split of the day (holdout_rules.py, held_out_tasks.py): the held-out
symbols, the held-out functions with passing tests that become the GPU lane's repository tasks, the code
completion points cut in every held-out function (completion_points.py), and the functions new or changed
that day to teach ("write the body").

`lora_dataset`: the CPU lane's accepted work (`accepted_work`) and the day's functions to teach, routed by
the split (rows about held-out symbols to eval only, their bodies masked out of training code), scrubbed of
secrets and prompt injection, deduplicated, fitted to the base model's max sequence length with its own
tokenizer, saved with `datasets` at `<artifacts>/lora_dataset/<day>/` (contract.py).
"""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from datetime import date

from dagster import AssetDep, AssetExecutionContext, AssetKey, MaterializeResult, MetadataValue, asset

from lanes_pipeline.daily.artifacts import md_table, read_partition, write_partition
from lanes_pipeline.daily.partitions import previous_day
from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.dataset.completion_rows import completion_rows
from lanes_pipeline.dataset.contract import check_kinds
from lanes_pipeline.dataset.held_out_tasks import (
    HELD_OUT_FILE,
    HELD_OUT_TASKS,
    SPLITS_FILE,
    HeldOutDay,
    RepoHoldOut,
    completion_of_repo,
    held_out_of_repo,
    load_splits,
)
from lanes_pipeline.dataset.holdout_rules import body_candidate, route
from lanes_pipeline.dataset.replay import replay_candidates, replay_functions, stdlib_dir
from lanes_pipeline.dataset.writer import (
    ACCEPTED_FILE,
    ACCEPTED_WORK,
    AcceptedWork,
    Candidate,
    DatasetFigures,
    load_token_counter,
    save_dataset,
    shape,
)
from lanes_pipeline.errors import about
from lanes_pipeline.repos.location import located_snapshots
from lanes_pipeline.repos.scan import body_text
from lanes_pipeline.steps import asset_step
from lanes_pipeline.store import ArtifactStore, sha256_tree

REPO_SNAPSHOT = AssetKey("repo_snapshot")
ACCEPTED_WORK_KEY, HELD_OUT_TASKS_KEY = AssetKey(ACCEPTED_WORK), AssetKey(HELD_OUT_TASKS)


def load_accepted_work(store: ArtifactStore, day: str) -> AcceptedWork:
    """accepted_work's partition of the day, as it wrote it."""
    return read_partition(
        store, ACCEPTED_WORK, day, ACCEPTED_FILE, AcceptedWork, "the CPU lane's accepted work"
    )


def taught_before(store: ArtifactStore, day: str) -> bool:
    """Whether a day before `day` was split (held_out_tasks wrote it whole): on the first such day (a new
    install, whose repository need not have changed that day) every function is new to the adapter and is
    taught. A folder that is no day (an unfinished write's staging folder) is not one."""
    root = store.root / HELD_OUT_TASKS
    if not root.is_dir():
        return False
    for child in root.iterdir():
        try:
            earlier = date.fromisoformat(child.name) < date.fromisoformat(day)
        except ValueError:
            continue
        if earlier and (child / HELD_OUT_FILE).is_file():
            return True
    return False


def skipped_of(splits: dict[str, RepoHoldOut]) -> dict[str, str]:
    """`repo: symbol id` -> why the day went on without it."""
    return {f"{repo}: {i}": why for repo, split in sorted(splits.items()) for i, why in split.skipped.items()}


@asset(
    group_name="dataset",
    # Its own day before: whether anything was taught yet (taught_before) is read from the earlier days.
    deps=[REPO_SNAPSHOT, ACCEPTED_WORK_KEY, AssetDep(HELD_OUT_TASKS_KEY, partition_mapping=previous_day())],
    description="The day's held-out symbols, the held-out functions with passing tests (the GPU lane's "
    "repository tasks), the completion points cut in the held-out functions and the new or changed "
    "functions to teach.",
)
@asset_step
def held_out_tasks(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    store = artifact_store.store()
    day = context.partition_key
    accepted = load_accepted_work(store, day).tests
    first = not taught_before(store, day)
    percent = settings.pipeline.dataset.held_out_percent
    tasks = HeldOutDay(held_out_percent=percent)
    splits: dict[str, RepoHoldOut] = {}
    for snapshot, location in located_snapshots(store, day, settings):
        if snapshot.commit is None:
            continue
        split = held_out_of_repo(
            snapshot,
            location,
            percent,
            accepted.get(snapshot.repo, {}),
            settings.pipeline.cpu_assets.sandbox,
            teach_all=first,
        )
        splits[snapshot.repo] = split
        tasks.bodies[snapshot.repo] = {}
        for symbol in split.held:
            with about(
                f"held-out symbol {snapshot.repo}: {symbol.id} (lines {symbol.start_line}-{symbol.end_line})"
            ):
                tasks.bodies[snapshot.repo][symbol.id] = body_text(symbol)
        for symbol_id, reason in sorted(split.skipped.items()):
            context.log.warning(
                f"{snapshot.repo}: {symbol_id} skipped (the day goes on without it): {reason}"
            )
        tasks.functions.extend(split.functions)
        points, sources = completion_of_repo(snapshot.repo, location, snapshot.commit, split.held)
        tasks.completion_points.extend(points)
        if sources:
            tasks.sources[snapshot.repo] = sources
        if split.problem is not None:
            context.log.warning(f"{snapshot.repo}: no held-out task, nothing taught today: {split.problem}")
        context.log.info(
            f"{snapshot.repo}: {len(split.held)} held-out symbol(s), {len(split.functions)} with passing "
            f"tests; {len(split.taught)} new or changed function(s) to write the body of; {len(points)} "
            "completion point(s)"
        )
    # A fixed order whatever order the repositories come in: by repository, function id, then line.
    tasks.completion_points.sort(key=lambda p: (p.repo, p.symbol, p.line))
    content_hash = write_partition(
        store,
        HELD_OUT_TASKS,
        day,
        {
            HELD_OUT_FILE: tasks.model_dump(mode="json"),
            SPLITS_FILE: {repo: split.model_dump(mode="json") for repo, split in splits.items()},
        },
    )
    return MaterializeResult(
        metadata={
            "held_out_percent": percent,
            "held_out_symbols": sum(len(v.held) for v in splits.values()),
            "held_out_tasks": len(tasks.functions),
            "completion_points": len(tasks.completion_points),
            "functions_to_teach": sum(len(v.taught) for v in splits.values()),
            "first_day": first,
            "skipped_symbols": sum(len(v.skipped) for v in splits.values()),
            "skipped": MetadataValue.json(skipped_of(splits)),
            "held_out_problems": MetadataValue.json(
                {repo: split.problem for repo, split in splits.items() if split.problem is not None}
            ),
            "artifact_hash": content_hash,
        }
    )


def _routed(candidate: Candidate, split: RepoHoldOut | None) -> Candidate:
    where = f"{candidate.task} row of {candidate.repo}: {candidate.path}" + (
        f"::{candidate.symbol}" if candidate.symbol else ""
    )
    with about(where):
        return route(candidate, split.held, split.unmaskable) if split is not None else route(candidate, [])


def _no_tokens(messages: list[dict[str, str]]) -> int:
    raise AssertionError("no candidate, nothing to count")  # shape() counts candidates only


@asset(
    group_name="dataset",
    deps=[ACCEPTED_WORK_KEY, held_out_tasks],
    description="Chat-format LoRA dataset of the day (train/eval): the CPU lane's accepted work and the "
    "day's functions to teach, rows about held-out symbols in eval only.",
)
@asset_step
def lora_dataset(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
    lora_training: LoraTrainingResource,
) -> MaterializeResult:
    """Rows for the model the GPU lane trains: its tokenizer and max sequence length come from the same
    resource lora_adapter trains with."""
    dataset_config = pipeline_settings.load().pipeline.dataset
    check_kinds(list(dataset_config.max_share), "pipeline.yaml: dataset.max_share")
    training = lora_training.config()
    store = artifact_store.store()
    day = context.partition_key
    candidates = list(load_accepted_work(store, day).candidates)
    splits = load_splits(store, day)
    context_chars = training.evaluation.completion_context_chars
    for repo, split in sorted(splits.items()):
        for symbol in split.taught:
            with about(f"{repo}: {symbol.id} (lines {symbol.start_line}-{symbol.end_line})"):
                candidates.append(body_candidate(repo, symbol))
                if symbol.path in split.files:
                    candidates += completion_rows(
                        repo,
                        symbol,
                        split.files[symbol.path],
                        split.held,
                        context_chars,
                        dataset_config.completion_cuts,
                        dataset_config.completion_lines,
                    )
    candidates = [_routed(c, splits.get(c.repo)) for c in candidates]
    # Replay goes with a day's own training rows, never alone: a day without change trains nothing.
    if dataset_config.replay_functions and any(not c.held_out for c in candidates):
        replay = replay_candidates(
            date.fromisoformat(day),
            replay_functions(stdlib_dir()),
            dataset_config.replay_functions,
            context_chars,
            dataset_config.completion_lines,
        )
        candidates += [_routed(c, None) for c in replay]
    shaped = shape(
        candidates,
        dataset_config.system_prompt,
        load_token_counter(lora_training.base_model_path()) if candidates else _no_tokens,
        training.max_seq_len,
        dataset_config.near_duplicate_threshold,
        dataset_config.max_share,
    )
    shares = shaped.train_shares()
    target = store.folder("lora_dataset", day)
    with store.atomic_folder(target) as staging:
        save_dataset(shaped, staging)
    content_hash = sha256_tree(target)
    write_partition(
        store,
        "lora_dataset_report",
        day,
        {
            "report.json": {
                "counts": shaped.counts(),
                "train_shares": shares,
                "max_share": dataset_config.max_share,
                "dropped": [d.model_dump() for d in shaped.dropped],
            }
        },
    )
    counts = shaped.counts()
    return MaterializeResult(
        metadata={
            **counts,
            **DatasetFigures(
                candidates=len(candidates),
                train_rows=counts["train_rows"],
                eval_rows=counts["eval_rows"],
                row_count=counts["train_rows"] + counts["eval_rows"],
            ).metadata(),
            "max_seq_len": training.max_seq_len,
            "train_shares": MetadataValue.json(shares),
            "dropped": md_table(
                ["task", "repo", "path", "reason", "detail"],
                [(d.task, d.repo, d.path, d.reason, d.detail) for d in shaped.dropped],
            ),
            "path": MetadataValue.path(str(target)),
            "artifact_hash": content_hash,
        }
    )

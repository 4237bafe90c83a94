"""`review_branch`: the day's accepted work as commits on the branch `lanes/<day>` of each repository (the
ones whose repos.yaml entry keeps `review_branch: true`), based on the day's snapshot commit: one commit per
accepted test, docstring and refactor diff, each message naming the symbol and the evidence. Written with
git plumbing (jobs/review_branch.py): the user's working tree, index, HEAD and stash are never touched, and
a re-run writes the same commits. Only what the allowlists pass (jobs/allowlist.py) is committed; an item
that fails them or no longer applies is skipped with its reason. The repository's tests then run once at
the tip, in the sandbox, in the repository's own environment. `lanes export` writes the same commits as a
patch series."""

# No `from __future__ import annotations` here: Dagster reads the context annotation at definition time.
from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from lanes_pipeline.cpu_lane.assets.common import read_results
from lanes_pipeline.cpu_lane.assets.generated_docs import generated_docs
from lanes_pipeline.cpu_lane.assets.generated_tests import generated_tests
from lanes_pipeline.cpu_lane.assets.refactor_proposals import refactor_proposals
from lanes_pipeline.cpu_lane.assets.repo_snapshot import repo_snapshot
from lanes_pipeline.cpu_lane.jobs.review import review_items
from lanes_pipeline.cpu_lane.jobs.review_branch import (
    ReviewBranchError,
    branch_name,
    identity,
    review_command,
    run_tests_at_tip,
    write_branch,
)
from lanes_pipeline.cpu_lane.jobs.rows import (
    GeneratedDocRow,
    GeneratedTestRow,
    RefactorRow,
    ReviewFigures,
    ReviewItemRow,
    ReviewRepoRow,
)
from lanes_pipeline.daily.artifacts import md_table, read_partition, write_partition
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.repos.location import located_snapshots
from lanes_pipeline.sandbox.isolation import Isolation, detect_isolation
from lanes_pipeline.steps import asset_step
from lanes_pipeline.store import ArtifactStore

REVIEW_BRANCH = "review_branch"
BRANCHES_FILE = "branches.json"


@asset(
    group_name="cpu_lane",
    # The day's snapshots, and every job whose accepted results become commits.
    deps=[repo_snapshot, generated_tests, generated_docs, refactor_proposals],
    description="The day's accepted tests, docstrings and refactors as commits on the branch lanes/<day> "
    "of each repository (from the day's snapshot commit), their tests checked at the tip in the sandbox.",
)
@asset_step
def review_branch(
    context: AssetExecutionContext,
    artifact_store: ArtifactStoreResource,
    pipeline_settings: PipelineSettingsResource,
) -> MaterializeResult:
    settings = pipeline_settings.load()
    store = artifact_store.store()
    day = context.partition_key
    tests = read_results(store, "generated_tests", day, GeneratedTestRow)
    docs = read_results(store, "generated_docs", day, GeneratedDocRow)
    refactors = read_results(store, "refactor_proposals", day, RefactorRow)
    entries = {e.name: e for e in settings.repos.repos}
    author = identity(day, settings.pipeline.timezone)
    isolation: list[Isolation] = []
    items: list[ReviewItemRow] = []
    branches: list[ReviewRepoRow] = []
    refused: list[str] = []
    for snapshot, location in located_snapshots(store, day, settings):
        none = {"repo": snapshot.repo, "location": str(location), "branch": None, "tip": None}
        if not entries[snapshot.repo].review_branch:
            note = "review_branch: false in repos.yaml"
            branches.append(_no_branch(none, snapshot.commit, note))
            continue
        if snapshot.commit is None:
            branches.append(_no_branch(none, None, "no commit at the end of the day"))
            continue
        found, skipped = review_items(snapshot.repo, tests, docs, refactors)
        try:
            written = write_branch(location, snapshot.repo, snapshot.commit, day, found, author)
        except ReviewBranchError as exc:
            refused.append(str(exc))
            branches.append(_no_branch(none, snapshot.commit, str(exc), len(found) + len(skipped)))
            continue
        rows = written.rows + skipped
        items += rows
        outcome = "not run: no commit on the branch"
        if written.tip is not None:
            if not isolation:
                isolation.append(detect_isolation())
            limits = settings.pipeline.cpu_assets.sandbox
            outcome = run_tests_at_tip(location, written.tip, limits, settings.data_dir, isolation[0]).outcome
        command = review_command(location, snapshot.commit, day) if written.tip else None
        context.log.info(
            f"{snapshot.repo}: {written.commits} commit(s) on {branch_name(day)}, "
            f"{len(rows) - written.commits} skipped; tests at the tip: {outcome}"
            + (f"; review: {command}" if command else "")
        )
        branches.append(
            ReviewRepoRow(
                **none | {"branch": written.branch, "tip": written.tip},
                base=snapshot.commit,
                commits=written.commits,
                skipped=len(rows) - written.commits,
                tests_at_tip=outcome,
                review_command=command,
                note="" if written.tip else "no accepted item became a commit",
            )
        )
    if refused:
        raise ReviewBranchError("\n".join(refused))
    content_hash = write_partition(
        store,
        REVIEW_BRANCH,
        day,
        {
            "results.json": [i.model_dump(mode="json") for i in items],
            BRANCHES_FILE: [b.model_dump(mode="json") for b in branches],
        },
    )
    return MaterializeResult(
        metadata={
            **ReviewFigures(
                repos=len(branches),
                branches=sum(b.branch is not None for b in branches),
                commits=sum(b.commits for b in branches),
                items_skipped=sum(b.skipped for b in branches),
                tips_passing=sum(b.tests_at_tip.startswith("passed") for b in branches),
            ).metadata(),
            "review_commands": MetadataValue.json([b.review_command for b in branches if b.review_command]),
            "review_branches": md_table(
                ["repo", "branch", "commits", "skipped", "tests at the tip", "review with"],
                [
                    (
                        b.repo,
                        b.branch or "-",
                        b.commits,
                        b.skipped,
                        b.tests_at_tip,
                        b.review_command or b.note,
                    )
                    for b in branches
                ],
            ),
            "items": md_table(
                ["repo", "kind", "symbol", "status", "commit or reason"],
                [(i.repo, i.kind, i.symbol, i.status, (i.commit or "")[:12] or i.reason) for i in items],
            ),
            "artifact_hash": content_hash,
        }
    )


def _no_branch(none: dict[str, object], base: str | None, note: str, skipped: int = 0) -> ReviewRepoRow:
    return ReviewRepoRow(
        **none,  # type: ignore[arg-type]
        base=base,
        commits=0,
        skipped=skipped,
        tests_at_tip="not run: no branch",
        review_command=None,
        note=note,
    )


def load_branches(store: ArtifactStore, day: str) -> list[ReviewRepoRow]:
    """review_branch's repositories of the day, as it wrote them (`lanes export` reads them)."""
    shape = list[ReviewRepoRow]
    return read_partition(store, REVIEW_BRANCH, day, BRANCHES_FILE, shape, "a list of review branches")

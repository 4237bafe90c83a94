"""`lanes export --day D [--repo NAME] [--patches DIR]`: a day's review branch as a patch series (`git
format-patch`, one file per commit; `git am` applies it), for whoever prefers patches to a branch. Reads
review_branch's partition of the day (each repository's branch and base) and the repositories' git objects;
asks no lane."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from lanes_pipeline.cpu_lane.assets.review_branch import load_branches
from lanes_pipeline.daily.resources import ArtifactStoreResource
from lanes_pipeline.git import GitError, format_patch, resolve
from lanes_pipeline.settings import ConfigError, data_dir, load_settings


@click.command()
@click.option(
    "--day",
    "when",
    required=True,
    type=click.DateTime(["%Y-%m-%d"]),
    help="The day whose review branch to export (YYYY-MM-DD).",
)
@click.option("--repo", "repo_name", default=None, metavar="NAME", help="Only this repository (repos.yaml).")
@click.option(
    "--patches",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the series goes, one folder per repository (default: <data>/review/<day>/); the *.patch "
    "files an earlier export left in a repository's folder are replaced.",
)
def export(when: datetime, repo_name: str | None, folder: Path | None) -> None:
    """Write the day's review branch (lanes/<day>) of each repository as a patch series and print where."""
    day = when.date().isoformat()
    try:
        names = [entry.name for entry in load_settings().repos.repos]
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if repo_name is not None and repo_name not in names:
        raise click.ClickException(
            f"--repo {repo_name}: no such repository in repos.yaml ({', '.join(names)})"
        )
    try:
        branches = load_branches(ArtifactStoreResource().store(), day)
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(f"{exc}\nRun the day first: lanes run --date {day}") from None
    chosen = [b for b in branches if repo_name is None or b.repo == repo_name]
    target = folder or data_dir() / "review" / day
    written = 0
    for branch in chosen:
        if branch.branch is None or branch.base is None:
            click.echo(f"{branch.repo}: no review branch for {day} ({branch.note})")
            continue
        location = Path(branch.location)
        if resolve(location, f"refs/heads/{branch.branch}") is None:
            raise click.ClickException(f"{branch.repo}: {location} has no branch {branch.branch} any more")
        for stale in sorted((target / branch.repo).glob("*.patch")):  # an earlier export's series
            stale.unlink()
        try:
            patches = format_patch(location, branch.base, f"refs/heads/{branch.branch}", target / branch.repo)
        except GitError as exc:
            raise click.ClickException(f"{branch.repo}: {exc}") from None
        written += len(patches)
        click.echo(f"{branch.repo}: {len(patches)} patch(es) of {branch.branch} in {target / branch.repo}")
        click.echo(f"  apply them with: git am {target / branch.repo}/*.patch")
    if not written:
        click.echo(f"nothing to export for {day}")

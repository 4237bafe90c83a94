"""`lanes report`: the learning curve over the evaluated days, as a Markdown table and a PNG chart under
`<data>/reports/`, both printed as paths; `lanes report --day D`: that day's paired outcome and the tasks
whose outcome changed, with both answers. Reads only the artifact store: no lane, no config needed."""

from __future__ import annotations

import click

from lanes_pipeline.daily.resources import ArtifactStoreResource
from lanes_pipeline.gpu_lane.evaluation_record import EvaluationRecordError, day_report
from lanes_pipeline.gpu_lane.learning_report import (
    LEARNING_ASSET,
    LEARNING_FILE,
    LearningReportError,
    load_points,
    markdown_table,
    render_chart,
)
from lanes_pipeline.settings import data_dir


@click.command()
@click.option(
    "--day",
    default=None,
    metavar="YYYY-MM-DD",
    help="One day's judgment instead of the curve: the paired outcome (wins, losses, ties per figure), "
    "the reasons, and each task whose outcome changed with both answers.",
)
def report(day: str | None) -> None:
    """Per day: the base model, the day's candidate and the served alias on each figure, with intervals.
    Writes <data>/reports/learning.md and learning.png and prints the table and both paths."""
    store = ArtifactStoreResource().store()
    if day is not None:
        try:
            text = day_report(store, day)
        except EvaluationRecordError as exc:
            raise click.ClickException(str(exc)) from None
        target = data_dir() / "reports" / f"evaluation-{day}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        click.echo(text)
        click.echo(f"report: {target}")
        return
    try:
        points = load_points(store)
    except LearningReportError as exc:
        raise click.ClickException(str(exc)) from None
    if not points:
        click.echo(
            f"no day has been evaluated yet: no {LEARNING_FILE} under {store.root / LEARNING_ASSET}.\n"
            "Run a day first: `lanes run --date YYYY-MM-DD`, or several with "
            "`lanes backfill --from YYYY-MM-DD --to YYYY-MM-DD --wait`; then `lanes report` again."
        )
        return
    table = markdown_table(points)
    reports = data_dir() / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    chart = render_chart(points, reports / "learning.png")
    markdown = reports / "learning.md"
    first, last = points[0].day.isoformat(), points[-1].day.isoformat()
    markdown.write_text(
        f"# Learning curve {first} .. {last}\n\nBase model, the day's candidate and the served alias, "
        f"measured each day on the same tasks.\n\n{table}\n\n![learning curve]({chart.name})\n",
        encoding="utf-8",
    )
    click.echo(table)
    click.echo(f"\ntable: {markdown}\nchart: {chart}")

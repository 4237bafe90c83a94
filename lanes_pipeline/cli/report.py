"""`lanes report`: the learning curve over the evaluated days, as a Markdown table and a PNG chart under
`<data>/reports/`, both printed as paths; `lanes report --day D`: that day's paired outcome and the tasks
whose outcome changed, with both answers, and each item of its review branch with the checks it passed.
Reads only the artifact store: no lane, no config needed."""

from __future__ import annotations

import click
from pydantic import BaseModel

from lanes_pipeline.cpu_lane.assets.common import read_results
from lanes_pipeline.cpu_lane.assets.review_branch import REVIEW_BRANCH
from lanes_pipeline.cpu_lane.jobs.review import checks_report
from lanes_pipeline.cpu_lane.jobs.rows import ReviewItemRow
from lanes_pipeline.daily.resources import ArtifactStoreResource
from lanes_pipeline.gpu_lane.evaluation_record import (
    DayAnswers,
    EvaluationRecordError,
    day_report,
    read_answers,
    read_decision,
)
from lanes_pipeline.gpu_lane.learning_report import (
    LEARNING_ASSET,
    LEARNING_FILE,
    LearningReportError,
    load_points,
    markdown_table,
    render_chart,
)
from lanes_pipeline.gpu_lane.promotion import Decision, LearningPoint
from lanes_pipeline.settings import data_dir
from lanes_pipeline.store import ArtifactStore


class CurveJson(BaseModel):
    """`lanes report --json`: every evaluated day's point of the learning curve, oldest first."""

    points: list[LearningPoint]


class DayJson(BaseModel):
    """`lanes report --day D --json`: the day's decision and every answer of each model, with its verdict."""

    day: str
    decision: Decision
    answers: DayAnswers


def review_rows(store: ArtifactStore, day: str) -> list[ReviewItemRow] | None:
    """The day's review_branch items (None: that asset has no partition of the day)."""
    if not store.exists(REVIEW_BRANCH, day, "results.json"):
        return None
    return read_results(store, REVIEW_BRANCH, day, ReviewItemRow)


@click.command()
@click.option(
    "--day",
    default=None,
    metavar="YYYY-MM-DD",
    help="One day's judgment instead of the curve: the paired outcome (wins, losses, ties per figure), "
    "the reasons, and each task whose outcome changed with both answers.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="The same as one JSON object on stdout (the curve's points; with --day the decision and every "
    "answer), and no file written.",
)
def report(day: str | None, as_json: bool) -> None:
    """Per day: the base model, the day's candidate and the served alias on each figure, with intervals.
    Writes <data>/reports/learning.md and learning.png and prints the table and both paths."""
    store = ArtifactStoreResource().store()
    if as_json:
        try:
            if day is not None:
                answers, decision = read_answers(store, day), read_decision(store, day)
                click.echo(DayJson(day=day, decision=decision, answers=answers).model_dump_json(indent=1))
            else:
                click.echo(CurveJson(points=load_points(store)).model_dump_json(indent=1))
        except (EvaluationRecordError, LearningReportError) as exc:
            raise click.ClickException(str(exc)) from None
        return
    if day is not None:
        review = review_rows(store, day)
        try:
            text = day_report(store, day)
        except EvaluationRecordError as exc:
            if review is None:
                raise click.ClickException(str(exc)) from None
            text = f"# {day}\n\nNo evaluation: {exc}\n"
        if review is not None:
            text += "\n" + checks_report(review) + "\n"
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

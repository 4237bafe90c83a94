"""`lanes report`: the learning curve over the evaluated days, as a Markdown table and a PNG chart under
`<data>/reports/`, both printed as paths. Reads only the artifact store: no lane, no config needed."""

from __future__ import annotations

import click

from lanes_pipeline.daily.resources import ArtifactStoreResource
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
def report() -> None:
    """Per day: the base model vs the served alias on repo_pass_rate, held-out eval loss and HumanEval
    pass@1. Writes <data>/reports/learning.md and learning.png and prints the table and both paths."""
    store = ArtifactStoreResource().store()
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
        f"# Learning curve {first} .. {last}\n\nBase model vs the served alias, measured each day on the "
        f"same tasks.\n\n{table}\n\n![learning curve]({chart.name})\n",
        encoding="utf-8",
    )
    click.echo(table)
    click.echo(f"\ntable: {markdown}\nchart: {chart}")

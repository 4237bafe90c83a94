"""`lanes trial run|list|compare` (named server configurations, measured and compared) and
`lanes bench lanes` (the lane benchmark on the configured lanes, as the daily asset runs it)."""

from __future__ import annotations

import click

from lanes_pipeline.cli.stopping import stop_like_ctrl_c
from lanes_pipeline.config.trials import load_trials
from lanes_pipeline.embedded.servers import LaneName, running_lanes
from lanes_pipeline.errors import LaneError
from lanes_pipeline.observatory.benchmark import lane_target, run_benchmark
from lanes_pipeline.observatory.compare import compare_row, markdown_table, write_chart
from lanes_pipeline.observatory.registry import TrialRegistry, registry_path
from lanes_pipeline.observatory.trials import run_trial
from lanes_pipeline.observatory.workload import WORKLOADS
from lanes_pipeline.settings import ConfigError, Settings, load_settings

_WORKLOAD = click.option(
    "--workload",
    type=click.Choice(sorted(WORKLOADS)),
    default="default",
    show_default=True,
    help="small: one request of each kind, for a busy small machine",
)


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def trial() -> None:
    """Trials: named server launch configurations (configs/trials.yaml), measured and compared."""


@trial.command("run")
@click.argument("names", nargs=-1, required=True)
@_WORKLOAD
@click.option(
    "--other-lane",
    type=click.Choice(["none", "running", "start"]),
    default="running",
    show_default=True,
    help="interference against the other lane: none, one already running, or start its embedded server",
)
def run_cmd(names: tuple[str, ...], workload: str, other_lane: str) -> None:
    """Start each trial's server, run the lane benchmark, record the result; a failed trial is recorded
    with its server's log tail and the next one runs. Exit 1 if any failed."""
    stop_like_ctrl_c()
    settings = _settings()
    trials = load_trials(settings.config_dir)
    try:
        specs = [trials.get(name) for name in names]
    except KeyError as exc:
        raise click.ClickException(str(exc.args[0])) from None
    failed = 0
    with TrialRegistry(registry_path(settings.data_dir)) as registry:
        for spec in specs:
            click.echo(f"[trial] {spec.name}: starting ({spec.lane} lane)", err=True)
            record = run_trial(spec, settings, WORKLOADS[workload], other_lane)  # type: ignore[arg-type]
            registry.add(record)
            if record.ok:
                click.echo(f"[trial] {spec.name}: done in {record.wall_s:.0f} s", err=True)
            else:
                failed += 1
                click.echo(f"[trial] {spec.name}: FAILED: {record.error}\n{record.log_tail or ''}", err=True)
    if failed:
        raise SystemExit(1)


@trial.command("list")
def list_cmd() -> None:
    """The shipped trials and when each last ran."""
    settings = _settings()
    with TrialRegistry(registry_path(settings.data_dir)) as registry:
        last = {record.name: record for record in registry.latest()}
    for spec in load_trials(settings.config_dir).trials:
        record = last.get(spec.name)
        ran = "never run" if record is None else f"last {record.started} ({'ok' if record.ok else 'FAILED'})"
        click.echo(f"{spec.name:24} {spec.lane}  {spec.model} [{spec.file}]  {ran}")


@trial.command("compare")
@click.argument("names", nargs=-1)
def compare_cmd(names: tuple[str, ...]) -> None:
    """Print the latest run of each trial side by side (Markdown) and write a PNG chart."""
    settings = _settings()
    with TrialRegistry(registry_path(settings.data_dir)) as registry:
        records = registry.latest(list(names) or None)
    if not records:
        raise click.ClickException("no trial has run yet: `lanes trial run NAME`")
    rows = [compare_row(record) for record in records]
    click.echo(markdown_table(rows))
    try:
        chart = write_chart(rows, settings.data_dir / "observatory" / "trials.png")
        click.echo(f"\nchart: {chart}", err=True)
    except ValueError as exc:
        click.echo(f"\nno chart: {exc}", err=True)


@click.group()
def bench() -> None:
    """Benchmarks of the running lanes."""


@bench.command("lanes")
@click.option("--lane", "which", type=click.Choice(["cpu", "gpu", "both"]), default="both", show_default=True)
@_WORKLOAD
def bench_lanes(which: str, workload: str) -> None:
    """Both lanes on the fixed workload (TTFT, PP, TG, p95, prefix hits, KV use, PF) and their interference;
    embedded lanes are started and stopped, external ones must answer."""
    stop_like_ctrl_c()
    settings = _settings()
    lanes: tuple[LaneName, ...] = ("cpu", "gpu") if which == "both" else (which,)  # type: ignore[assignment]
    try:
        with running_lanes(settings, lanes) as endpoints:
            targets = {lane: lane_target(settings, lane, endpoints.url(lane)) for lane in lanes}
            result = run_benchmark(
                targets.get("cpu"), targets.get("gpu"), WORKLOADS[workload], settings.lanes.bandwidth
            )
    except LaneError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(result.markdown())

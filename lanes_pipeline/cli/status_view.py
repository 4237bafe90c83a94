"""What `lanes status` reports, as one model, and how it reads: pure. `status.py` gathers it (the lanes'
HTTP endpoints, the adapter registry, the Dagster instance, the artifact store, the schedule); everything
here turns plain values into the model and the model into text, and decides the exit code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from pathlib import PurePath
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel

from lanes_pipeline.cpu_lane.jobs.tests_day import SymbolTestCoverage
from lanes_pipeline.dataset.writer import DatasetFigures
from lanes_pipeline.embedded.servers import LANE_LABEL
from lanes_pipeline.gpu_lane.adapters import AliasMove, Version
from lanes_pipeline.gpu_lane.promotion import Figures
from lanes_pipeline.http import ModelList
from lanes_pipeline.metrics.prometheus import LaneCounters
from lanes_pipeline.settings import LaneName

# `lanes status` exits with this when a lane is down (the top-level --help lists every exit code).
LANE_DOWN_EXIT = 3


class LaneStatus(BaseModel):
    """One server of a lane (the CPU lane may have several endpoints)."""

    lane: LaneName
    url: str | None  # None: an embedded lane on a free port (port 0) that is not running
    up: bool
    problem: str | None  # why it is down
    models: list[str]  # what /v1/models lists (the GPU lane's base model and adapters)
    slots_total: int | None  # llama-server's slots; vLLM does not say
    slots_busy: int | None  # requests being processed (llama-server) or running (vLLM)
    requests_waiting: int | None  # deferred (llama-server) or waiting (vLLM)


class AliasStatus(BaseModel):
    """The adapter name editors ask for, what the registry says it serves, and what vLLM has loaded."""

    name: str
    version: str | None  # None: the alias never moved (requests for it get HTTP 404)
    day: date | None  # the day the version was trained for
    since: datetime | None  # when the alias last moved
    moved_because: str | None
    figures: dict[str, float]  # the version's own figures, measured on its day
    loaded: bool | None  # vLLM lists the alias; None: the GPU lane is down
    loaded_version: str | None  # the version folder vLLM loaded the alias from


class LastDay(BaseModel):
    """The newest `daily_lanes` run and what its day's assets recorded."""

    day: str
    run_id: str
    outcome: str  # the run's status: success, failure, canceled, started, ...
    ended_at: datetime | None
    accepted_total: int | None  # accepted results the dataset reads (accepted_work)
    accepted: dict[str, int]  # ...by task: write_tests, write_docs, refactor_diff, write_body, explain
    dataset_rows: int | None
    adapter: str | None
    decision: str | None  # promote, reject, or "no adapter: why"
    branch: str | None  # the review branch of the day's accepted work, when the day made one


class NextRun(BaseModel):
    schedule: str
    cron: str
    timezone: str
    at: datetime
    for_day: date  # the daily partition that tick runs: the day that has just ended
    enabled: bool  # the schedule's default status; it ticks only while the Dagster daemon runs


class Status(BaseModel):
    checked_at: datetime
    lanes: list[LaneStatus]
    alias: AliasStatus
    last_day: LastDay | None
    next_run: NextRun | None
    coverage_day: str | None
    coverage: list[SymbolTestCoverage]
    problems: list[str]  # what could not be read, and why

    def lanes_down(self) -> list[LaneStatus]:
        return [lane for lane in self.lanes if not lane.up]

    def exit_code(self) -> int:
        return LANE_DOWN_EXIT if self.lanes_down() else 0


# -- building the parts from plain values -------------------------------------------------------------------


def next_daily_run(cron: str, timezone: str, now: datetime) -> tuple[datetime, date]:
    """The next tick of a daily cron (`M H * * *`, as a daily partitioned schedule has) strictly after
    `now`, in `timezone`, and the day that tick runs (the day before it: the last completed one)."""
    fields = cron.split()
    if len(fields) != 5 or fields[2:] != ["*", "*", "*"] or not all(f.isdigit() for f in fields[:2]):
        raise ValueError(f"cron {cron!r} is not a daily schedule of the form 'MINUTE HOUR * * *'")
    minute, hour = int(fields[0]), int(fields[1])
    if minute > 59 or hour > 23:
        raise ValueError(f"cron {cron!r}: minute or hour out of range")
    zone = ZoneInfo(timezone)
    local = now.astimezone(zone)
    # Through the wall clock of each day: a tick is at H:M local time whatever the offset that day.
    for offset in range(3):
        day = local.date() + timedelta(days=offset)
        at = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
        if at > local:
            return at, day - timedelta(days=1)
    raise AssertionError("a daily tick lies within the next two days")


def lane_down(lane: LaneName, url: str | None, problem: str) -> LaneStatus:
    return LaneStatus(
        lane=lane,
        url=url,
        up=False,
        problem=problem,
        models=[],
        slots_total=None,
        slots_busy=None,
        requests_waiting=None,
    )


def lane_up(
    lane: LaneName, url: str, models: ModelList, counters: LaneCounters | None, slots_total: int | None
) -> LaneStatus:
    """A lane that answered /v1/models; its /metrics (None: unreadable) give what is busy and waiting."""
    waiting = None if counters is None or counters.requests_waiting is None else counters.requests_waiting
    return LaneStatus(
        lane=lane,
        url=url,
        up=True,
        problem=None,
        models=[card.id for card in models.data],
        slots_total=slots_total,
        slots_busy=None if counters is None else round(counters.requests_running),
        requests_waiting=None if waiting is None else round(waiting),
    )


def alias_of(
    name: str, history: Sequence[AliasMove], target: Version | None, gpu_models: ModelList | None
) -> AliasStatus:
    """The alias from the registry's record of its moves (oldest first) and the version it last moved to,
    and from vLLM's /v1/models (None: the GPU lane is down)."""
    last = history[-1] if history else None
    card = next((c for c in gpu_models.data if c.id == name), None) if gpu_models is not None else None
    return AliasStatus(
        name=name,
        version=target.name if target else None,
        day=target.day if target else None,
        since=datetime.fromisoformat(last.moved_at) if last else None,
        moved_because=last.reason if last else None,
        figures=plain_figures(target.evaluation) if target else {},
        loaded=(card is not None) if gpu_models is not None else None,
        loaded_version=PurePath(card.root).name if card is not None and card.root else None,
    )


def plain_figures(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """A version's own figures from its evaluation record (`figures.candidate`): the measured ones only."""
    candidate = evaluation.get("figures", {}).get("candidate")
    if not candidate:
        return {}
    figures = Figures.model_validate(candidate).model_dump(
        exclude={"eval_loss_by_kind", "intervals", "tasks"}
    )
    return {name: value for name, value in figures.items() if value is not None}


def decision_of(evaluation: Mapping[str, Any]) -> str | None:
    """adapter_evaluation's metadata -> promote, reject, or no adapter and why."""
    if "no_adapter" in evaluation:
        return f"no adapter: {evaluation['no_adapter']}"
    if "promote" in evaluation:
        return "promote" if evaluation["promote"] else "reject"
    return None


def last_day(
    day: str, run_id: str, outcome: str, ended_at: datetime | None, metadata: Mapping[str, Mapping[str, Any]]
) -> LastDay:
    """The day's figures from its assets' latest materialization metadata (asset -> {key: plain value}); an
    asset that did not materialize that day leaves its figures None."""
    work = metadata.get("accepted_work", {})
    dataset = metadata.get("lora_dataset")
    return LastDay(
        day=day,
        run_id=run_id,
        outcome=outcome,
        ended_at=ended_at,
        accepted_total=work.get("candidates"),
        accepted={
            key.removeprefix("candidates_"): int(value)
            for key, value in sorted(work.items())
            if key.startswith("candidates_") and value
        },
        dataset_rows=DatasetFigures.read(dataset).row_count if dataset is not None else None,
        adapter=metadata.get("lora_adapter", {}).get("version"),
        decision=decision_of(metadata.get("adapter_evaluation", {})),
        # review_branch writes every repository's work of the day on the same branch name.
        branch=f"lanes/{day}" if metadata.get("review_branch", {}).get("branches") else None,
    )


# -- text ---------------------------------------------------------------------------------------------------

FIGURE_LABELS = {
    "completion_edit_similarity": ("completion edit similarity", False),
    "completion_exact_match": ("completion exact", True),
    "repo_pass_rate": ("repository tasks", True),
    "anchor_pass_rate": ("anchor set", True),
    "humaneval_pass1": ("HumanEval", True),
    "eval_loss": ("eval loss", False),
}


def _when(moment: datetime | None, zone: str = "UTC") -> str:
    return "-" if moment is None else moment.astimezone(ZoneInfo(zone)).strftime(f"%Y-%m-%d %H:%M {zone}")


def _lane_line(lane: LaneStatus) -> str:
    where = lane.url or "(embedded, not running)"
    head = f"  {LANE_LABEL[lane.lane]} lane  {'up  ' if lane.up else 'DOWN'}  {where}"
    if not lane.up:
        return f"{head}\n      {lane.problem}"
    slots = "-" if lane.slots_busy is None else str(lane.slots_busy)
    if lane.slots_total is not None:
        slots += f"/{lane.slots_total}"
    waiting = "-" if lane.requests_waiting is None else str(lane.requests_waiting)
    return f"{head}  {', '.join(lane.models) or '-'}  slots busy {slots}, waiting {waiting}"


def _alias_lines(alias: AliasStatus) -> list[str]:
    lines = [f"Alias {alias.name} (the model name editors use; docs/editors.md)"]
    if alias.version is None:
        lines.append("  serves no adapter yet: requests for it get 404 until a day promotes one")
    else:
        lines.append(
            f"  serves {alias.version} (trained for {alias.day}) since {_when(alias.since)}"
            f" ({alias.moved_because})"
        )
        shown = [
            f"{label} {value:.0%}" if share else f"{label} {value:.3f}"
            for name, (label, share) in FIGURE_LABELS.items()
            if (value := alias.figures.get(name)) is not None
        ]
        lines.append(f"  its figures on its day: {', '.join(shown) or 'none recorded'}")
    if alias.loaded is None:
        lines.append("  loaded in vLLM: unknown (the GPU lane is down)")
    elif not alias.loaded:
        lines.append("  loaded in vLLM: no (`lanes adapters restore` loads it again)")
    elif alias.version is not None and alias.loaded_version != alias.version:
        lines.append(
            f"  loaded in vLLM: from {alias.loaded_version}, not {alias.version} (`lanes adapters restore`)"
        )
    else:
        lines.append("  loaded in vLLM: yes")
    return lines


def _last_day_lines(day: LastDay | None) -> list[str]:
    if day is None:
        return ["Last day: no daily_lanes run recorded (`lanes run` or `make dev`'s schedule makes one)"]
    ended = f", ended {_when(day.ended_at)}" if day.ended_at else ""
    accepted = ", ".join(f"{n} {task}" for task, n in day.accepted.items()) or "none"
    total = "-" if day.accepted_total is None else str(day.accepted_total)
    return [
        f"Last day {day.day}: {day.outcome} (run {day.run_id[:8]}{ended})",
        f"  accepted work: {total} ({accepted})",
        f"  dataset {'-' if day.dataset_rows is None else day.dataset_rows} rows; adapter "
        f"{day.adapter or '-'}; decision {day.decision or '-'}",
        f"  review branch: {day.branch or 'none'}",
    ]


def _next_run_line(run: NextRun | None) -> str:
    if run is None:
        return "Next run: unknown (the schedule could not be read; see the problems below)"
    state = "" if run.enabled else " (the schedule is off: pipeline.schedule_enabled)"
    return (
        f"Next run: {_when(run.at, run.timezone)} for {run.for_day}{state} ({run.schedule}, cron "
        f"'{run.cron}'; it runs while the Dagster daemon does: `make dev` or `lanes service`)"
    )


def _coverage_lines(status: Status) -> list[str]:
    if not status.coverage:
        return ["Coverage: no day has recorded generated_tests' coverage yet"]
    lines = [f"Coverage by generated tests, as of {status.coverage_day}"]
    width = max(len(c.repo) for c in status.coverage)
    for c in status.coverage:
        share = f"{c.covered / c.symbols:.0%}" if c.symbols else "-"
        lines.append(
            f"  {c.repo:<{width}}  {c.covered} of {c.symbols} symbols covered ({share}), "
            f"{c.with_accepted_test} with an accepted test, {c.remaining} waiting in the backlog"
        )
        if c.import_problems:
            first = next(iter(c.import_problems.values()))
            lines.append(f"  {'':<{width}}  {len(c.import_problems)} module(s) not asked: {first}")
    return lines


def render(status: Status) -> str:
    lines = [f"lanes status at {_when(status.checked_at)}", "", "Lanes"]
    lines += [_lane_line(lane) for lane in status.lanes]
    lines += ["", *_alias_lines(status.alias), "", *_last_day_lines(status.last_day)]
    lines += ["", _next_run_line(status.next_run), "", *_coverage_lines(status)]
    if status.problems:
        lines += ["", "Could not read:", *(f"  {problem}" for problem in status.problems)]
    down = status.lanes_down()
    if down:
        names = sorted({LANE_LABEL[lane.lane] for lane in down})
        which = f"{names[0]} lane is" if len(names) == 1 else f"{' and '.join(names)} lanes are"
        lines += ["", f"The {which} down (exit code {LANE_DOWN_EXIT}): `lanes serve` or `make dev` starts it"]
    return "\n".join(lines)

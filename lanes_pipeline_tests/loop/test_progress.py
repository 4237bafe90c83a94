"""`lanes run` shows the day's steps as they start and end, and inside a CPU-lane step its items done of all
with an ETA, on the terminal and in Dagster's log alike: one source (the step's events and `context.log`)
that the run's event log keeps and the terminal logger prints. The pure parts (the lines, durations, the
ETA) are tested alone; a small job run in process shows the logger doing it, and a run that does not
configure it (the daemon's) printing none of it."""

# No `from __future__ import annotations`: Dagster reads the context annotation of the assets below.

import pytest
from dagster import (
    AssetExecutionContext,
    AssetSelection,
    DagsterInstance,
    Definitions,
    asset,
    colored_console_logger,
    define_asset_job,
    validate_run_config,
)

from lanes_pipeline.cpu_lane.batching.batch_summary import BatchProgress, format_duration
from lanes_pipeline.cpu_lane.resources import LogProgress
from lanes_pipeline.definitions import build_definitions
from lanes_pipeline.loop.progress import TERMINAL_LOGGER, StepEvent, StepLines, run_loggers, terminal_logger
from lanes_pipeline.settings import Settings

STEPS = ["cpu_lane_probe", "repo_snapshot", "generated_tests"]


def test_steps_are_numbered_in_the_days_order_and_timed() -> None:
    lines = StepLines(STEPS)
    assert lines.lines(StepEvent("start", "repo_snapshot"), now=100.0) == [
        "[lanes] step 2/3 repo_snapshot ..."
    ]
    assert lines.lines(StepEvent("success", "repo_snapshot"), now=172.4) == [
        "[lanes] step 2/3 repo_snapshot: done in 1 min 12 s"
    ]
    lines.lines(StepEvent("start", "generated_tests"), now=200.0)
    assert lines.lines(StepEvent("retry", "generated_tests"), now=230.0) == [
        "[lanes] step 3/3 generated_tests: failed after 30 s, to be retried"
    ]
    assert lines.lines(StepEvent("failure", "generated_tests"), now=260.0) == [
        "[lanes] step 3/3 generated_tests: FAILED after 1 min 00 s (Dagster's error above)"
    ]
    message = "CPU lane generated_tests sample: 4/12 done (33%): 0 from cache, 0 failed; ETA 1 min 00 s"
    assert lines.lines(StepEvent("message", "generated_tests", message), now=261.0) == [
        f"[lanes]     generated_tests: {message}"
    ]


def test_a_check_shows_only_when_it_fails_and_a_run_level_event_not_at_all() -> None:
    lines = StepLines(STEPS)
    assert lines.lines(StepEvent("start", "lora_dataset_no_secrets"), now=0.0) == []
    assert lines.lines(StepEvent("success", "lora_dataset_no_secrets"), now=0.5) == []
    assert lines.lines(StepEvent("start", "repo_snapshot_rows_present"), now=1.0) == []
    assert lines.lines(StepEvent("failure", "repo_snapshot_rows_present"), now=3.0) == [
        "[lanes] check repo_snapshot_rows_present: FAILED after 2 s (Dagster's error above)"
    ]
    assert lines.lines(StepEvent("message", None, "run started"), now=4.0) == []
    assert lines.lines(StepEvent("skipped", "generated_tests"), now=5.0) == [
        "[lanes] step 3/3 generated_tests: skipped (an upstream step did not materialize)"
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (59.4, "59 s"),
        (60, "1 min 00 s"),
        (3599, "59 min 59 s"),
        (3600, "1 h 00 min"),
        (7385, "2 h 03 min"),
    ],
)
def test_durations_read_as_a_person_reads_them(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_the_eta_is_the_rest_at_the_rate_the_server_answered() -> None:
    # 4 of 10 from the cache at once, 2 answered in 60 s: the 4 left take 120 s more.
    progress = BatchProgress(total=10, done=6, cache_hits=4, failed=0, elapsed_s=60.0, answered=2)
    assert progress.eta_s == pytest.approx(120.0)
    assert progress.line() == "6/10 done (60%): 4 from cache, 0 failed; 1 min 00 s elapsed, ETA 2 min 00 s"
    assert BatchProgress(10, 4, 4, 0, 1.0, 0).line().endswith("ETA unknown")  # nothing answered yet


def _day_job() -> Definitions:
    """Two steps like the day's: one that only works, one that logs a CPU-lane batch's progress through
    the resource's own progress logger, as every CPU-lane asset does."""

    @asset
    def repo_snapshot() -> None:
        return None

    @asset(deps=[repo_snapshot])
    def generated_tests(context: AssetExecutionContext) -> None:
        report = LogProgress(context.log, "generated_tests sample", every_s=0.0)
        report(BatchProgress(total=4, done=0, cache_hits=0, failed=0, elapsed_s=0.0, answered=0))
        report(BatchProgress(total=4, done=2, cache_hits=0, failed=0, elapsed_s=20.0, answered=2))

    return Definitions(
        assets=[repo_snapshot, generated_tests],
        jobs=[define_asset_job("day", selection=AssetSelection.all())],
        loggers={"console": colored_console_logger, TERMINAL_LOGGER: terminal_logger},
    )


def test_lanes_run_prints_each_step_and_the_batch_progress_that_dagster_logs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = _day_job().resolve_job_def("day")
    instance = DagsterInstance.ephemeral()
    config = {"loggers": run_loggers(["repo_snapshot", "generated_tests"], verbose=False)}
    result = job.execute_in_process(run_config=config, instance=instance)
    assert result.success
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == "[lanes] step 1/2 repo_snapshot ..."
    assert lines[1].startswith("[lanes] step 1/2 repo_snapshot: done in ")
    assert lines[2] == "[lanes] step 2/2 generated_tests ..."
    progress = [line for line in lines if "CPU lane generated_tests sample:" in line]
    head = "[lanes]     generated_tests: CPU lane generated_tests sample:"
    assert progress == [
        f"{head} 0/4 done (0%): 0 from cache, 0 failed; 0 s elapsed, ETA unknown",
        f"{head} 2/4 done (50%): 0 from cache, 0 failed; 20 s elapsed, ETA 20 s",
    ]
    assert lines[-1].startswith("[lanes] step 2/2 generated_tests: done in ")
    assert "STEP_START" not in err  # Dagster's console logger is down to warnings
    # The same lines are in the run's event log, where the UI reads them.
    entries = instance.all_logs(result.run_id)
    logged = [entry.user_message for entry in entries if entry.dagster_event is None]
    assert any("2/4 done (50%)" in message and "ETA 20 s" in message for message in logged)
    started = [entry for entry in entries if entry.dagster_event and entry.dagster_event.is_step_start]
    assert len(started) == 2


def test_a_run_that_does_not_configure_the_terminal_prints_none_of_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = _day_job().resolve_job_def("day").execute_in_process(instance=DagsterInstance.ephemeral())
    assert result.success
    out, err = capsys.readouterr()
    assert "[lanes]" not in out + err
    assert "STEP_START" in out + err  # Dagster's default console logging, as the daemon's runs have it


def test_the_daily_job_takes_the_run_config_lanes_run_gives_it(settings: Settings) -> None:
    """`lanes run` configures both loggers on the real daily_lanes job: it must know them, and they must not
    change what a run the daemon launches (no logger config) gets."""
    job = build_definitions(settings).resolve_job_def("daily_lanes")
    assert set(job.loggers) == {"console", TERMINAL_LOGGER}
    validate_run_config(job, {"loggers": run_loggers(["repo_snapshot", "generated_tests"], verbose=True)})

"""Host CPU and memory per step in the metadata: `asset_step` under `@asset` keeps what Dagster reads
from the signature (context, resources) and adds psutil's figures over the step to the MaterializeResult."""

# No `from __future__ import annotations` here: Dagster reads the annotations of the assets below.
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from dagster import (
    AssetExecutionContext,
    DagsterInstance,
    DailyPartitionsDefinition,
    Failure,
    MaterializeResult,
    RetryPolicy,
    asset,
    materialize,
)

from lanes_pipeline.daily.resources import ArtifactStoreResource
from lanes_pipeline.errors import (
    LaneConnectionError,
    LaneNotReadyError,
    LaneTimeoutError,
    about,
    is_transient_error,
    status_error,
)
from lanes_pipeline.steps import STOP_REQUESTED, asset_step

DAYS = DailyPartitionsDefinition(start_date="2026-11-01")


@asset(partitions_def=DAYS)
@asset_step
def busy_step(context: AssetExecutionContext, artifact_store: ArtifactStoreResource) -> MaterializeResult:
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # keep one core busy: the mean cannot be zero
        sum(range(10_000))
    block = bytearray(64 * 2**20)  # 64 MiB touched: the step's peak RSS must show it
    return MaterializeResult(metadata={"day": context.partition_key, "bytes": len(block)})


@asset(partitions_def=DAYS, output_required=False)
@asset_step
def yielding_step(context: AssetExecutionContext) -> Iterator[MaterializeResult]:
    yield MaterializeResult(metadata={"day": context.partition_key})


def test_each_step_gets_host_cpu_and_memory_figures(tmp_path: Path) -> None:
    result = materialize(
        [busy_step, yielding_step],
        resources={"artifact_store": ArtifactStoreResource(root=str(tmp_path))},
        partition_key="2026-11-02",
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    figures = {
        e.asset_key.to_user_string(): {k: v.value for k, v in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
    }
    busy = figures["busy_step"]
    assert busy["day"] == "2026-11-02"  # the asset's own metadata is kept
    assert busy["host/cpu_count"] == psutil.cpu_count()
    assert 100 / psutil.cpu_count() * 0.5 <= busy["host/cpu_percent_mean"] <= 100  # at least half a core
    assert busy["host/cpu_percent_max"] >= busy["host/cpu_percent_mean"] * 0.5
    assert 0 < busy["host/memory_percent_max"] <= 100 and busy["host/memory_available_gb_min"] > 0
    assert busy["host/process_peak_rss_mb"] >= 64
    assert busy["host/step_wall_s"] >= 1.5
    assert figures["yielding_step"]["host/step_wall_s"] < 1.5 and "host/cpu_count" in figures["yielding_step"]


def test_a_step_that_starts_after_a_stop_signal_refuses_to_run_for_good() -> None:
    calls = []

    @asset_step
    def step() -> None:
        calls.append(1)

    step()
    STOP_REQUESTED.set()
    try:
        with pytest.raises(Failure, match="asked to stop") as raised:
            step()
        assert raised.value.allow_retries is False and calls == [1]
    finally:
        STOP_REQUESTED.clear()


ATTEMPTS: list[str] = []
QUICK_RETRY = RetryPolicy(max_retries=2, delay=0)


@asset(retry_policy=QUICK_RETRY)
@asset_step
def step_with_a_bad_symbol() -> MaterializeResult:
    ATTEMPTS.append("deterministic")
    with about("symbol pkg/mod.py::Cache.__init__ (lines 10-14)"):
        raise IndentationError("unexpected indent (<unknown>, line 1)")


@asset(retry_policy=QUICK_RETRY)
@asset_step
def step_with_a_lane_down() -> MaterializeResult:
    ATTEMPTS.append("transient")
    raise LaneConnectionError("CPU", "http://127.0.0.1:9", "POST", "/completion", "connection refused")


def test_a_deterministic_error_fails_the_step_at_once_naming_the_item_and_a_lane_error_is_retried() -> None:
    ATTEMPTS.clear()
    result = materialize([step_with_a_bad_symbol], instance=DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success and ATTEMPTS == ["deterministic"]  # one try, no retry with backoff
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.user_failure_data
    assert "IndentationError: unexpected indent" in failure.description
    assert "while handling symbol pkg/mod.py::Cache.__init__ (lines 10-14)" in failure.description
    ATTEMPTS.clear()
    result = materialize([step_with_a_lane_down], instance=DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success and ATTEMPTS == ["transient"] * 3  # the policy's two retries


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (LaneConnectionError("CPU", "u", "POST", "/completion", "refused"), True),
        (LaneTimeoutError("CPU", "u", "POST", "/completion", "read timeout"), True),
        (status_error(503, "CPU", "u", "POST", "/completion", "Loading model"), True),
        (status_error(429, "GPU", "u", "POST", "/v1/completions", "busy"), True),
        (status_error(400, "CPU", "u", "POST", "/completion", "bad grammar"), False),
        (LaneNotReadyError("GPU", "u", 600, "503 loading"), True),
        (sqlite3.OperationalError("database is locked"), True),
        (sqlite3.OperationalError("no such table: answers"), False),
        (SyntaxError("invalid syntax"), False),
        (ValueError("not a held-out task list"), False),
        (KeyError("shapes.py"), False),
        (AssertionError("no candidate"), False),
    ],
)
def test_only_transient_lane_errors_are_left_to_the_retry_policy(error: Exception, transient: bool) -> None:
    assert is_transient_error(error) is transient

    @asset_step
    def step() -> None:
        raise error

    with pytest.raises(Failure if not transient else type(error)) as raised:
        step()
    if not transient:
        assert raised.value.allow_retries is False and type(error).__name__ in raised.value.description


def test_a_wrapped_lane_error_is_as_transient_as_its_cause_and_every_endpoint_down_is_transient() -> None:
    from lanes_pipeline.cpu_lane.batching.endpoint_choice import AllEndpointsDownError
    from lanes_pipeline.errors import ServingError

    down = LaneConnectionError("GPU", "u", "POST", "/v1/load_lora_adapter", "refused")
    try:
        raise ServingError("load failed") from down
    except ServingError as wrapped:
        assert is_transient_error(wrapped)
    assert not is_transient_error(ServingError("no earlier promoted version to roll back to"))
    assert is_transient_error(AllEndpointsDownError([]))

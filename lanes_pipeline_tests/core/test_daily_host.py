"""Host CPU and memory per step in the metadata: `with_host_figures` under `@asset` keeps what Dagster reads
from the signature (context, resources) and adds psutil's figures over the step to the MaterializeResult."""

# No `from __future__ import annotations` here: Dagster reads the annotations of the assets below.
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
    asset,
    materialize,
)

from lanes_pipeline.daily.resources import ArtifactStoreResource
from lanes_pipeline.host import STOP_REQUESTED, with_host_figures

DAYS = DailyPartitionsDefinition(start_date="2026-11-01")


@asset(partitions_def=DAYS)
@with_host_figures
def busy_step(context: AssetExecutionContext, artifact_store: ArtifactStoreResource) -> MaterializeResult:
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # keep one core busy: the mean cannot be zero
        sum(range(10_000))
    block = bytearray(64 * 2**20)  # 64 MiB touched: the step's peak RSS must show it
    return MaterializeResult(metadata={"day": context.partition_key, "bytes": len(block)})


@asset(partitions_def=DAYS, output_required=False)
@with_host_figures
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

    @with_host_figures
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

"""What `lanes backfill` asks Dagster for: a backfill of the daily_lanes job's partition set, or an asset
backfill that names the days of every daily asset (given only partition names, Dagster would also target the
days after them that lora_adapter's replay window maps to). Fast: nothing is submitted."""

from __future__ import annotations

from datetime import date

import click
import pytest

from lanes_pipeline.cli.backfill import backfill_id_from, backfill_params, check_days, day_range

DAYS = ["2026-11-01", "2026-11-02"]


def test_a_job_backfill_names_the_partition_set_and_the_days() -> None:
    params = backfill_params(DAYS, "t")
    assert params["selector"]["partitionSetName"] == "daily_lanes_partition_set"
    assert params["partitionNames"] == DAYS and "partitionsByAssets" not in params


def test_an_asset_backfill_names_the_days_of_every_daily_asset() -> None:
    assets = check_days(DAYS)
    assert {"repo_snapshot", "lora_dataset", "lora_adapter", "adapter_evaluation", "served_adapter"} <= set(
        assets
    )
    assert "cpu_lane_probe" not in assets  # unpartitioned: it runs in every run, not per day
    params = backfill_params(DAYS, "t", assets)
    assert "partitionNames" not in params and "selector" not in params
    named = {tuple(entry["assetKey"]["path"]): entry["partitions"] for entry in params["partitionsByAssets"]}
    assert set(named) == {(asset,) for asset in assets}
    assert all(p == {"range": {"start": DAYS[0], "end": DAYS[-1]}} for p in named.values())


def test_days_and_refusals() -> None:
    assert day_range(date(2026, 11, 1), date(2026, 11, 2)) == DAYS
    with pytest.raises(click.BadParameter, match="not daily partitions"):
        check_days(["2000-01-01"])
    refused = {"data": {"launchPartitionBackfill": {"__typename": "PythonError", "message": "boom"}}}
    with pytest.raises(click.ClickException, match=r"refused the backfill \(PythonError\): boom"):
        backfill_id_from(refused)

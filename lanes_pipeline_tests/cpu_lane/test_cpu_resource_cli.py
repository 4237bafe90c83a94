"""The CPU lane's Dagster resource inside a real run, and the `lanes cpu` CLI, against the real server."""

# No `from __future__ import annotations`: Dagster reads the asset's context annotation at definition time.
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from dagster import AssetExecutionContext, DagsterInstance, MaterializeResult, asset, materialize

from lanes_pipeline.cli.cpu import cpu
from lanes_pipeline.cpu_lane.resources import CpuLaneResource, servers_metadata
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.settings import CpuLane, Settings, project_root
from lanes_pipeline_tests.config_files import read_config, write_config
from lanes_pipeline_tests.cpu_lane.fixtures import questions


@asset(pool="cpu_lane")
def tiny_cpu_batch(context: AssetExecutionContext, cpu_lane: CpuLaneResource) -> MaterializeResult:
    result = cpu_lane.run_batch(questions(3, offset=200), log=context.log, label="tiny batch", log_every_s=0)
    summary = {f"cpu_lane/{key}": value for key, value in result.summary.metadata().items()}
    return MaterializeResult(metadata=summary | servers_metadata([result]))


def _materialize(url: str, cache: Path) -> tuple[list[str], dict[str, object]]:
    instance = DagsterInstance.ephemeral()
    resource = CpuLaneResource(config=CpuLane(base_url=url, cache_path=str(cache)))
    result = materialize([tiny_cpu_batch], resources={"cpu_lane": resource}, instance=instance)
    assert result.success
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    metadata = result.asset_materializations_for_node("tiny_cpu_batch")[0].metadata
    return messages, {key: getattr(value, "value", value) for key, value in metadata.items()}


def test_resource_in_a_dagster_run_logs_progress_and_summary_metadata(
    cpu_server: EmbeddedServer, tmp_path: Path
) -> None:
    cache = tmp_path / "cpu.sqlite3"
    messages, metadata = _materialize(cpu_server.url, cache)
    progress = [m for m in messages if m.startswith("CPU lane tiny batch: ") and " done (" in m]
    assert progress and "3/3 done (100%)" in progress[-1] and "ETA 0 s" in progress[-1]
    assert any("ETA" in m for m in progress[:-1])  # the lines before the end carry an estimate too
    assert any("3/3 ok (0 from cache, 3 answered)" in m for m in messages)
    assert metadata["cpu_lane/answered"] == 3 and metadata["cpu_lane/failed"] == 0
    for key in (
        "latency_p50_s",
        "latency_p95_s",
        "prompt_tokens_per_s",
        "generation_tokens_per_s",
        "prefix_cache_reuse",
        "cache_hits",
    ):
        assert f"cpu_lane/{key}" in metadata
    assert metadata["cpu_lane/slots"] == 2
    # The same day again: everything from the cache, and the run says so.
    messages, metadata = _materialize(cpu_server.url, cache)
    assert metadata["cpu_lane/cache_hits"] == 3 and metadata["cpu_lane/requests_sent"] == 0
    assert any("3/3 ok (3 from cache, 0 answered)" in m for m in messages)


@pytest.fixture
def cli_env(cpu_server: EmbeddedServer, tmp_path: Path) -> dict[str, str]:
    """A copy of configs/ pointing the CPU lane at the session server, and a data folder of its own."""
    config_dir = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", config_dir)
    lanes = read_config(config_dir / "lanes.yaml")
    lanes["cpu_lane"]["base_url"] = cpu_server.url
    write_config(config_dir / "lanes.yaml", lanes)
    return {"LANES_CONFIG_DIR": str(config_dir), "LANES_DATA_DIR": str(tmp_path / "data")}


def test_cli_ask_answers_then_answers_from_the_cache(cli_env: dict[str, str], tmp_path: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(cpu, ["ask", "Name a fruit that is red.", "--max-tokens", "8"], env=cli_env)
    assert first.exit_code == 0, first.output
    assert first.stdout.strip() and "tokens in" in first.stderr
    again = runner.invoke(cpu, ["ask", "Name a fruit that is red.", "--max-tokens", "8"], env=cli_env)
    assert again.exit_code == 0 and again.stdout == first.stdout
    assert "from the cache" in again.stderr
    assert (tmp_path / "data" / "cache" / "cpu_lane.sqlite3").is_file()  # the default cache path


def test_cli_batch_writes_results_in_order_and_fails_over_the_ratio(
    cli_env: dict[str, str], tmp_path: Path, settings: Settings
) -> None:
    batch = tmp_path / "batch.jsonl"
    lines = [
        {"id": "one", "prompt": "Name a fruit that is yellow.", "max_tokens": 8},
        {"id": "two", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6},
        {"id": "long", "prompt": " ".join(["word"] * 5000), "max_tokens": 8},
    ]
    batch.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "results.jsonl"
    runner = CliRunner()
    result = runner.invoke(
        cpu, ["batch", str(batch), "--out", str(out), "--max-failure-ratio", "0.5"], env=cli_env
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == ["one", "two", "long"]
    assert [row["status"] for row in rows] == ["ok", "ok", "failed"]
    assert rows[2]["failure"]["kind"] == "too_long" and "'long'" in rows[2]["failure"]["reason"]
    assert "2/3 ok" in result.stderr and "failed: long:" in result.stderr
    assert "100%" in result.stderr and "3/3" in result.stderr  # the progress bar

    # cpu_lane.max_failure_ratio from lanes.yaml (0.25): one of three failed is too many.
    strict = runner.invoke(cpu, ["batch", str(batch), "--no-progress"], env=cli_env)
    assert strict.exit_code == 1 and "33% of items failed" in strict.stderr
    assert [json.loads(line)["from_cache"] for line in strict.stdout.splitlines()] == [True, True, False]

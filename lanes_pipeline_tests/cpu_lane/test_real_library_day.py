"""A real library's first day, through the CPU-lane assets and `lora_dataset`, on the real llama-server
(issue 24: such a day crashed in `lora_dataset` on a held-out method's indented source).

The repository is `cachetools` 5.5.0 as its PyPI sdist ships it (real_code/), committed once: a class over
120 lines (`TTLCache`) is taken method by method, and the held-out share is set so that its methods are held
out while other functions are taught. The day must end with a dataset: the held-out methods' bodies known to
the leak check and absent from every training row, no symbol skipped, and the rest taught as "write the
body" rows. No dependency file is committed, so the project's own Python runs the repository's tests (no
download). A few symbols, one sample each and short answers keep it to minutes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, time
from typing import Any

import pytest
import yaml
from dagster import DagsterInstance, load_assets_from_modules, materialize

from lanes_pipeline.bench.cpu_yield import empty_data_dir
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.partitions import daily_partitions, partitioned_daily
from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.dataset import window as training_window
from lanes_pipeline.dataset.held_out_tasks import HeldOutDay, load_held_out, training_leaks
from lanes_pipeline.dataset.holdout_rules import is_held_out
from lanes_pipeline.definitions import CPU_DAY_MODULES
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.settings import CpuLane, Settings, load_settings
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.config_files import read_config, write_config
from lanes_pipeline_tests.cpu_lane.real_code import sdist_files

pytestmark = pytest.mark.timeout(1800)

REPO = "cachetools"
BIG_CLASS = "src/cachetools/__init__.py::TTLCache"  # over 120 lines: its methods are the symbols


def _percent_holding(symbol_id: str) -> int:
    """The smallest held-out percent that holds `symbol_id` out (holdout_rules.is_held_out's rule)."""
    return next(percent for percent in range(1, 101) if is_held_out(REPO, symbol_id, percent))


@dataclass
class Day:
    metadata: dict[str, dict[str, Any]]
    held: HeldOutDay
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]


@pytest.fixture(scope="module")
def first_day(
    tmp_path_factory: pytest.TempPathFactory, settings: Settings, cpu_server: EmbeddedServer
) -> Iterator[Day]:
    root = tmp_path_factory.mktemp("real_library")
    files = {
        path: text
        for path, text in sdist_files("cachetools-5.5.0").items()
        if path.startswith(("src/", "tests/")) or path in {"LICENSE", "README.rst"}
    }
    day = settings.pipeline.start_date
    when = datetime.combine(day, time(12), tzinfo=UTC)
    build_history(root / "repo", [CommitSpec(when=when, message="cachetools 5.5.0", files=files)])
    configs = root / "configs"
    shutil.copytree(settings.config_dir, configs)
    entry = {"name": REPO, "path": str(root / "repo"), "branch": "main", "include": ["src/**/*.py"]}
    (configs / "repos.yaml").write_text(yaml.safe_dump({"repos": [entry]}), encoding="utf-8")
    pipeline = read_config(settings.config_dir / "pipeline.yaml")
    pipeline["cpu_assets"].update(
        backlog_per_day=2,
        samples_per_item=1,
        body_samples=1,
        body_max_tokens=96,
        analysis_max_tokens=96,
        tests_max_tokens=96,
        refactor_max_tokens=96,
        sandbox={"timeout_s": 60, "memory_mb": 1024, "runs": 1},
    )
    pipeline["dataset"]["held_out_percent"] = _percent_holding(f"{BIG_CLASS}.__init__")
    write_config(configs / "pipeline.yaml", pipeline)
    with empty_data_dir(settings.data_dir):
        project = load_settings(configs)
        store = ArtifactStore(root / "artifacts")
        resources = {
            "cpu_lane": CpuLaneResource(
                config=CpuLane(base_url=cpu_server.url, cache_path=str(root / "cache.sqlite3"))
            ),
            "artifact_store": ArtifactStoreResource(root=str(store.root)),
            "pipeline_settings": PipelineSettingsResource(config_dir=str(configs)),
            "lora_training": LoraTrainingResource.from_config(project.training),
        }
        assets = partitioned_daily(
            load_assets_from_modules(CPU_DAY_MODULES),
            daily_partitions(project),  # type: ignore[arg-type]
        )
        result = materialize(
            assets, resources=resources, partition_key=day.isoformat(), instance=DagsterInstance.ephemeral()
        )
        assert result.success, [e.message for e in result.all_events if e.is_step_failure]
        metadata = {
            e.asset_key.to_user_string(): {k: v.value for k, v in e.materialization.metadata.items()}
            for e in result.get_asset_materialization_events()
        }
        held = load_held_out(store, day.isoformat())
        folder = [training_window.partition_dir(store.root, day)]
        yield Day(
            metadata,
            held,
            training_window.load_split(folder, "train"),
            training_window.load_split(folder, "eval"),
        )


def test_a_real_librarys_first_day_runs_to_its_dataset_with_methods_held_out(first_day: Day) -> None:
    dataset, split = first_day.metadata["lora_dataset"], first_day.metadata["held_out_tasks"]
    held = first_day.held.bodies[REPO]
    methods = sorted(i for i in held if i.startswith(f"{BIG_CLASS}."))
    assert f"{BIG_CLASS}.__init__" in methods and len(methods) >= 5, sorted(held)
    assert all(held[i] for i in methods), "a held-out method's body came back empty"
    assert split["skipped_symbols"] == 0 and split["skipped"] == {}
    assert first_day.metadata["repo_analysis"]["skipped_symbols"] == 0
    # Taught: functions that are not held out, each as a "write the body" row; none holds a held-out body.
    tasks = {row["task"] for row in first_day.train}
    assert "write_body" in tasks, tasks
    assert (
        training_leaks(first_day.held, [m["content"] for row in first_day.train for m in row["messages"]])
        == []
    )
    assert dataset["train_rows"] == len(first_day.train) > 0
    assert split["held_out_symbols"] >= len(methods)

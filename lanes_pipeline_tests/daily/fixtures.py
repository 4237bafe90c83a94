"""A private project for the daily-loop tests: configs that point the lanes at the session's real servers,
a data folder and a Dagster instance of its own, and few training steps.

The embedded engines and the converted model stay where the session found them (`LANES_ENGINES_DIR`, the
project's `data/models/`): the test configs name the converted model's folder, so nothing is installed or
converted again. The sample repository is rebuilt under the private data folder (a few git commits).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from dagster import DagsterInstance

from lanes_pipeline.embedded import engines
from lanes_pipeline.settings import Settings, project_root
from lanes_pipeline_tests.config_files import read_config, write_config
from lanes_pipeline_tests.gpu_lane.fixtures import write_codename_day

# Measured in test_gpu_pipeline: the codename fact is learned by step 6 at this learning rate.
TRAINING = {
    "max_steps": 8,
    "learning_rate": 0.002,
    "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
    "batch_size": 4,
    "max_seq_len": 256,
    "eval_max_samples": 8,
    # SmolLM2-135M's figures are noise on a handful of tasks and what is under test here is the day's
    # mechanics: the gate's primary figure is the eval loss without a significance test (alpha 1) and the
    # guards' margins are wide (the paired rule is covered in test_promotion_rule and test_executed_judge);
    # three repository tasks, one anchor, two HumanEval problems and eight completion points are still
    # asked and recorded for base, current and candidate.
    "evaluation": {
        "primary_figure": "eval_loss",
        "alpha": 1.0,
        "margins": {"repo_pass_rate": 1.0, "anchor_pass_rate": 1.0, "humaneval_pass1": 1.0},
        "humaneval_problems": 2,
        "anchor_tasks": 1,
        "max_completion_points": 8,
        "max_repo_tasks": 3,
        "max_tokens": 128,
    },
}
# Less CPU-lane work per day than the shipped defaults: the changed symbols and one of the backlog, each
# judged in one sandbox run. The mechanics under test are the same; a 2-core CI machine finishes sooner.
CPU_ASSETS = {
    # generated_tests works symbol by symbol: a day's backlog and samples stay small, so a day's run is
    # minutes on two cores (test_cpu_assets.py and the cpu_yield benchmark cover the yield itself).
    "backlog_per_day": 1,
    "samples_per_item": 2,
    "body_samples": 2,
    "body_max_tokens": 192,
    "tests_max_tokens": 192,
    "refactor_max_tokens": 192,
    "sandbox": {"runs": 1},
}
# The sample's first two modules only (the daily tests were sized on them): the rest of the sample grows
# every day's CPU-lane work by a dozen symbols (the cpu_yield and learning benchmarks cover it whole).
SAMPLE_MODULES = ["textstats.py", "slug.py"]
# A day before the tests' days, the partitions' first: "accepted data from earlier days" in every replay
# window of the tests' days. A 135M model's own answers are rarely accepted, and a day without rows trains
# nothing.
EARLIER_DAY = date(2026, 10, 31)


@dataclass(frozen=True)
class DailyProject:
    config_dir: Path
    data_dir: Path
    dagster_home: Path

    @property
    def artifacts(self) -> Path:
        return self.data_dir / "artifacts"

    def env(self) -> dict[str, str]:
        return {
            "LANES_CONFIG_DIR": str(self.config_dir),
            "LANES_DATA_DIR": str(self.data_dir),
            "DAGSTER_HOME": str(self.dagster_home),
        }


def daily_project(
    root: Path,
    settings: Settings,
    cpu_url: str,
    gpu_url: str,
    training: dict[str, Any] | None = None,
    seed_earlier_day: bool = True,
    dataset: dict[str, Any] | None = None,
    pipeline_changes: dict[str, Any] | None = None,
    cpu_assets: dict[str, Any] | None = None,
    modules: list[str] | None = None,
) -> DailyProject:
    """`modules`: the sample's modules the repository config includes (default SAMPLE_MODULES)."""
    config_dir, data, home = root / "configs", root / "data", root / "dagster_home"
    for folder in (config_dir, data, home):
        folder.mkdir(parents=True, exist_ok=True)
    shipped = project_root() / "configs"
    shutil.copy(shipped / "models.yaml", config_dir / "models.yaml")
    repos = read_config(shipped / "repos.yaml")
    for repo in repos["repos"]:
        repo["include"] = modules or SAMPLE_MODULES
    write_config(config_dir / "repos.yaml", repos)
    pipeline = read_config(shipped / "pipeline.yaml")
    assets = CPU_ASSETS | (cpu_assets or {})
    sandbox = {**pipeline["cpu_assets"]["sandbox"], **assets["sandbox"]}
    pipeline["cpu_assets"] |= assets | {"sandbox": sandbox}
    pipeline["dataset"] |= dataset or {}
    pipeline |= pipeline_changes or {}
    if seed_earlier_day:  # a partition, so the replay window's mapping reaches it
        pipeline["start_date"] = EARLIER_DAY.isoformat()
    write_config(config_dir / "pipeline.yaml", pipeline)
    lanes = read_config(shipped / "lanes.yaml")
    lanes["cpu_lane"]["base_url"], lanes["gpu_lane"]["base_url"] = cpu_url, gpu_url
    lanes["bandwidth"]["quiet_s"] = 1  # the tests' lanes are quiet between steps: do not wait long
    write_config(config_dir / "lanes.yaml", lanes)
    train = read_config(shipped / "training.yaml")
    changes = {**TRAINING, **(training or {})}
    lora = {**train["lora"], **changes.pop("lora")}
    train |= changes | {"lora": lora}
    train["base_model_dir"] = str(engines.embedded_hf_model(settings.data_dir).resolve())
    write_config(config_dir / "training.yaml", train)
    shutil.copy(project_root() / "dagster.yaml", home / "dagster.yaml")
    # Create the instance's SQLite databases now, in one process: a daemon and a CLI creating them at the
    # same moment race on the schema migrations (alembic "more than one head").
    DagsterInstance.from_config(str(home)).dispose()
    if seed_earlier_day:
        # With its split (nothing held out): the tests' first day teaches what changed that day, not every
        # function as a new install's first day does.
        write_codename_day(data / "artifacts", EARLIER_DAY)
    return DailyProject(config_dir, data, home)

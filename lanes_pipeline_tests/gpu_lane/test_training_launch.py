"""The trainer's command line under each launcher, the launcher settings in configs/training.yaml, and how a
batch is shared between trainer processes. Pure: nothing is started."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from accelerate.commands.launch import launch_command_parser

from lanes_pipeline.gpu_lane.training.launch import LAUNCH_MODULE, TRAINER_MODULE, trainer_argv
from lanes_pipeline.gpu_lane.training.world import Single, gpus_short, shard
from lanes_pipeline.settings import ConfigError, TrainingConfig, load_settings, project_root
from lanes_pipeline_tests.config_files import read_config, write_config

SPEC = Path("/tmp/spec.json")
PY = "/venv/bin/python"


def test_single_runs_the_trainer_module_itself() -> None:
    assert trainer_argv("train", SPEC, TrainingConfig(), cpus=2, python=PY) == [
        PY,
        "-m",
        TRAINER_MODULE,
        "train",
        str(SPEC),
    ]
    assert trainer_argv("train", SPEC, None, cpus=2, python=PY) == [
        PY,
        "-m",
        TRAINER_MODULE,
        "train",
        str(SPEC),
    ]


def test_accelerate_launches_n_processes_and_evaluation_stays_single() -> None:
    training = TrainingConfig(launcher="accelerate", processes=2)
    argv = trainer_argv("train", SPEC, training, cpus=16, python=PY)
    assert argv == [
        PY,
        "-m",
        LAUNCH_MODULE,
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--num_cpu_threads_per_process",
        "8",
        "--multi_gpu",
        "--main_process_port",
        "0",
        "-m",
        TRAINER_MODULE,
        "train",
        str(SPEC),
    ]
    # Accelerate's own parser reads it as meant (LAUNCH_MODULE hands these arguments to it unchanged).
    args = launch_command_parser().parse_args(argv[3:])
    assert (args.num_processes, args.multi_gpu, args.main_process_port, args.cpu) == (2, True, 0, False)
    assert (args.module, args.training_script, args.training_script_args) == (
        True,
        TRAINER_MODULE,
        ["train", str(SPEC)],
    )
    assert args.num_cpu_threads_per_process == 8
    assert trainer_argv("eval", SPEC, training, cpus=16, python=PY) == [
        PY,
        "-m",
        TRAINER_MODULE,
        "eval",
        str(SPEC),
    ]


def test_accelerate_with_one_process_uses_the_plain_launcher_and_threads_are_at_least_one() -> None:
    argv = trainer_argv("train", SPEC, TrainingConfig(launcher="accelerate", processes=1), cpus=4, python=PY)
    assert "--multi_gpu" not in argv and argv[argv.index("--num_processes") + 1] == "1"
    assert argv[argv.index("--num_cpu_threads_per_process") + 1] == "4"
    many = trainer_argv("train", SPEC, TrainingConfig(launcher="accelerate", processes=8), cpus=2, python=PY)
    assert many[many.index("--num_cpu_threads_per_process") + 1] == "1"


def test_each_process_scores_every_nth_row_and_together_all_of_them() -> None:
    rows = ["a", "b", "c", "d", "e"]
    assert shard(rows, 0, 2) == ["a", "c", "e"]
    assert shard(rows, 1, 2) == ["b", "d"]
    assert sorted(shard(rows, 0, 3) + shard(rows, 1, 3) + shard(rows, 2, 3)) == rows
    assert shard(["a"], 1, 2) == []  # a short last batch: this process adds a zero gradient
    assert Single().shard(rows) == rows and Single().sum(1.5) == 1.5


def test_gpu_processes_need_a_gpu_each() -> None:
    assert gpus_short(2, "cuda", 2) is None and gpus_short(1, "cuda", 1) is None
    assert gpus_short(2, "cpu", 0) is None  # CPU processes share the cores
    assert gpus_short(2, "cuda", 1) == (
        "training.processes is 2 but torch sees 1 CUDA device(s): one process per GPU "
        "(set processes to at most that, or device: cpu)"
    )


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", target)
    monkeypatch.chdir(tmp_path)
    return target


def _training(config_dir: Path, **changes: Any) -> None:
    path = config_dir / "training.yaml"
    data = read_config(path)
    data.update(changes)
    write_config(path, data)


def test_the_shipped_config_trains_in_one_process(config_dir: Path) -> None:
    training = load_settings(config_dir).training
    assert (training.launcher, training.processes) == ("single", 2)


def test_accelerate_with_one_process_is_allowed(config_dir: Path) -> None:
    _training(config_dir, launcher="accelerate", processes=1)
    training = load_settings(config_dir).training
    assert (training.launcher, training.processes) == ("accelerate", 1)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"launcher": "torchrun"},
            "configs/training.yaml: launcher: 'torchrun' is not one of single or accelerate",
        ),
        (
            {"launcher": "accelerate", "processes": 0},
            "configs/training.yaml: processes: 0: input should be greater than or equal to 1",
        ),
        (
            {"launcher": "accelerate", "processes": "two"},
            "configs/training.yaml: processes: 'two' is not valid: "
            "input should be a valid integer, unable to parse string as an integer",
        ),
        (
            {"launcher": "accelerate", "trainer": "trl"},
            "configs/training.yaml: launcher: 'accelerate' runs our loop only (trainer: loop); "
            "trainer: trl runs with launcher: single",
        ),
    ],
    ids=["unknown-launcher", "no-processes", "processes-not-a-number", "accelerate-with-trl"],
)
def test_bad_launcher_settings_name_file_and_key(
    config_dir: Path, changes: dict[str, Any], expected: str
) -> None:
    _training(config_dir, **changes)
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert [str(issue) for issue in caught.value.issues] == [expected]

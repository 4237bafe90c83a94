"""The trainer's command line: one Python process (`launcher: single`), or `accelerate launch` with
`processes` trainer processes (`launcher: accelerate`: DDP, one process per GPU or CPU processes that
all-reduce over gloo). Evaluation always runs in one process: it is short, and reads no shard.

Run as `python -m lanes_pipeline.gpu_lane.training.launch ACCELERATE-ARGS...`, this module makes the
launcher die with the run process (as the single trainer does) and then becomes `accelerate launch`: the
launcher's workers die with the launcher, so a killed run leaves no trainer behind.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the launcher process starts without the settings (and Dagster) imported
    from lanes_pipeline.settings import TrainingConfig

TRAINER_MODULE = "lanes_pipeline.gpu_lane.training"
LAUNCH_MODULE = "lanes_pipeline.gpu_lane.training.launch"
ACCELERATE_LAUNCH = "accelerate.commands.launch"


def trainer_argv(
    command: str, spec_path: Path, training: TrainingConfig | None, cpus: int, python: str = sys.executable
) -> list[str]:
    """The command that runs `command` (train or eval) on the spec at `spec_path`; `cpus` are shared
    between the processes (their OpenMP threads)."""
    trainer = ["-m", TRAINER_MODULE, command, str(spec_path)]
    if command != "train" or training is None or training.launcher == "single":
        return [python, *trainer]
    processes = training.processes
    # Every value accelerate would otherwise guess (and warn about) is given: no config file is read.
    launch = [
        python,
        "-m",
        LAUNCH_MODULE,
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--num_cpu_threads_per_process",
        str(max(1, cpus // processes)),
    ]
    if processes > 1:
        # accelerate's torchrun launcher, which starts the processes on one machine: `--cpu` starts several
        # only through mpirun. The trainer then picks the device from training.device: the CPU (gloo) or one
        # GPU per process (nccl). Port 0: a free one, so two runs on one machine do not collide.
        launch += ["--multi_gpu", "--main_process_port", "0"]
    return [*launch, *trainer]


def main(argv: list[str]) -> None:
    """Die with the parent (PR_SET_PDEATHSIG survives exec), then become `accelerate launch ARGV`."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl took effect
            raise SystemExit(1)
    os.execv(sys.executable, [sys.executable, "-m", ACCELERATE_LAUNCH, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])

"""Which trainer process this is, and what the processes share: one process (`launcher: single`), or N
under `accelerate launch` (`launcher: accelerate`). Runs in the trainer process.

Data parallel, the same step as one process would take: every process draws the same micro-batches (the
same seed, the same stream), scores its shard of each one's rows (every N-th, so the lengths, sorted within
a batch, spread evenly), divides its summed loss by the labelled tokens of the whole accumulation group, and
the gradients are summed over the processes once per optimizer step. The sum is the gradient one process
would get from the whole group (the loss is a token mean over the group), so the same seed trains the same
adapter, up to float rounding, whatever the number of processes.

The gradients are all-reduced here rather than by wrapping the model in DDP: our loss runs the base
model's body and its vocabulary projection separately (on labelled positions only, model.py), which DDP's
forward hooks would not see, and a process whose shard of a short last batch is empty must still take part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from lanes_pipeline.settings import TrainingConfig

Row = TypeVar("Row")


class World(Protocol):
    rank: int
    size: int

    @property
    def is_main(self) -> bool: ...

    def device(self, default: Any) -> Any: ...

    def shard(self, rows: Sequence[Row]) -> list[Row]: ...

    def sync_parameters(self, params: Sequence[Any]) -> None: ...

    def sum_gradients(self, params: Sequence[Any]) -> None: ...

    def sum(self, value: float) -> float: ...

    def close(self) -> None: ...


def shard(rows: Sequence[Row], rank: int, size: int) -> list[Row]:
    """This process's rows of a batch: every `size`-th from `rank` (empty when the batch is short)."""
    return list(rows[rank::size])


class Single:
    """One trainer process: everything is its own."""

    rank = 0
    size = 1

    @property
    def is_main(self) -> bool:
        return True

    def device(self, default: Any) -> Any:
        return default

    def shard(self, rows: Sequence[Row]) -> list[Row]:
        return list(rows)

    def sync_parameters(self, params: Sequence[Any]) -> None:
        pass

    def sum_gradients(self, params: Sequence[Any]) -> None:
        pass

    def sum(self, value: float) -> float:
        return value

    def close(self) -> None:
        pass


class Accelerated:
    """One of the processes `accelerate launch` started, through accelerate's Accelerator (which joins the
    process group: gloo on the CPU, nccl on GPUs)."""

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.rank = int(accelerator.process_index)
        self.size = int(accelerator.num_processes)

    @property
    def is_main(self) -> bool:
        return bool(self.accelerator.is_main_process)

    def device(self, default: Any) -> Any:
        return self.accelerator.device  # cuda:LOCAL_RANK on GPUs: one device per process

    def shard(self, rows: Sequence[Row]) -> list[Row]:
        return shard(rows, self.rank, self.size)

    def sync_parameters(self, params: Sequence[Any]) -> None:
        """The main process's trainable weights everywhere (the seed makes them equal already; this makes
        it so even where an initialisation is not deterministic)."""
        from accelerate.utils import broadcast

        for param in params:
            param.data.copy_(broadcast(param.data.clone(), from_process=0))

    def sum_gradients(self, params: Sequence[Any]) -> None:
        """One all-reduce of every trainable gradient, flattened (a process that scored no row adds 0)."""
        import torch

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self.accelerator.reduce(torch.cat([g.reshape(-1) for g in grads]), reduction="sum")
        offset = 0
        for param, grad in zip(params, grads, strict=True):
            count = grad.numel()
            param.grad = flat[offset : offset + count].view_as(param).clone()
            offset += count

    def sum(self, value: float) -> float:
        import torch

        total = torch.tensor([value], dtype=torch.float64, device=self.accelerator.device)
        return float(self.accelerator.reduce(total, reduction="sum")[0])

    def close(self) -> None:
        import torch.distributed as dist

        self.accelerator.wait_for_everyone()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def gpus_short(processes: int, device_type: str, cuda_devices: int) -> str | None:
    """Why `processes` cannot each have a GPU (nccl refuses two processes on one), or None."""
    if device_type != "cuda" or processes <= cuda_devices:
        return None
    return (
        f"training.processes is {processes} but torch sees {cuda_devices} CUDA device(s): one process per "
        "GPU (set processes to at most that, or device: cpu)"
    )


def open_world(training: TrainingConfig) -> World:
    """Single for `launcher: single`; else this process's place among those accelerate started (on the
    CPU when training.device resolves to it, so the processes use gloo)."""
    if training.launcher == "single":
        return Single()
    from accelerate import Accelerator

    from lanes_pipeline.gpu_lane.training.model import pick_device

    device, _dtype = pick_device(training.device)
    if device.type == "cuda":
        import torch

        problem = gpus_short(training.processes, device.type, torch.cuda.device_count())
        if problem is not None:
            raise RuntimeError(problem)
    return Accelerated(Accelerator(cpu=device.type == "cpu"))

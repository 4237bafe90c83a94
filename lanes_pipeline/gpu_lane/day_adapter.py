"""What the GPU lane's assets share about a day: the adapter lora_adapter decided on (trained, reused, or
none and why), which evaluation and serving follow, and which errors fail a step for good."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date

from dagster import Failure
from pydantic import BaseModel

from lanes_pipeline.errors import LaneError
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.training.runner import TrainingError
from lanes_pipeline.settings import ConfigError
from lanes_pipeline.store import ArtifactStore

DAY_OUTCOME = "outcome.json"


class DayAdapter(BaseModel):
    """What lora_adapter decided for a day (artifacts/lora_adapter/<day>/outcome.json): the version it
    trained or reused, or none and why. Evaluation and serving follow it."""

    version: str | None = None
    reason: str


@contextmanager
def failing_for_good(step: str) -> Iterator[None]:
    """An error that the same inputs raise again (bad config or data, an incompatible adapter, a missing
    version) becomes a Failure that skips the retry policy; a lane that is down or busy (LaneError) and a
    Failure that says otherwise pass through as they are."""
    try:
        yield
    except (Failure, LaneError):
        raise
    except TrainingError as exc:
        # A trainer (or eval) process that raised will raise again (data, device, config): no retry; a
        # killed one (the OOM killer, a shutdown) may not be killed again.
        raise Failure(f"{step}: {exc}", allow_retries=exc.transient) from exc
    except (ValueError, LookupError, ConfigError, FileExistsError) as exc:
        raise Failure(f"{step}: {exc}", allow_retries=False) from exc


def record_outcome(store: ArtifactStore, day: date, outcome: DayAdapter) -> None:
    store.write_json("lora_adapter", day.isoformat(), DAY_OUTCOME, outcome.model_dump())


def day_outcome(store: ArtifactStore, registry: AdapterRegistry, day: date) -> DayAdapter:
    """The day's adapter as lora_adapter recorded it; without a record, the registry's latest of the day."""
    if store.exists("lora_adapter", day.isoformat(), DAY_OUTCOME):
        return DayAdapter.model_validate(store.read_json("lora_adapter", day.isoformat(), DAY_OUTCOME))
    versions = registry.versions(day)
    if not versions:
        raise Failure(
            f"no adapter version for {day}: materialize lora_adapter for this partition first",
            allow_retries=False,
        )
    return DayAdapter(version=versions[-1].name, reason="the day's latest version in the registry")

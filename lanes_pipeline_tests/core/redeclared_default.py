"""A class that declares a config setting's default again, as batch_models.BatchConfig once did
(`max_slots: int = 2` beside CpuLane's): what test_shipped_configs must find."""

from __future__ import annotations

from pydantic import BaseModel, Field


class OldBatchConfig(BaseModel):
    model_alias: str
    max_slots: int = Field(2, ge=1)
    lease_dir: str | None = None

"""Serving adapter versions on the GPU lane: load, verify, move the stable alias, roll back, restore, prune.

One place for what the assets, the CLI, the rollback job and the restart sensor all do, so they agree. It
knows the vLLM client and the registry, not Dagster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from lanes_pipeline.errors import AdapterNotLoadedError, AdapterPathNotFoundError, LaneError, ServingError
from lanes_pipeline.gpu_lane.adapters import (
    AdapterRegistry,
    Version,
    check_adapter_dir,
    missing_on_vllm_side,
    rollback_target,
    supported_target_modules,
    versions_to_unload,
    vllm_path,
)
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.http import ChatMessage, ChatRequest, ModelCard
from lanes_pipeline.settings import AdapterPathMap, GpuLane

SMOKE_PROMPT = "Say hello."


@contextmanager
def step(name: str) -> Iterator[None]:
    """Say which step of a promotion, rollback or restore failed (the lane error says which URL)."""
    try:
        yield
    except LaneError as exc:
        raise ServingError(f"{name} failed: {exc}") from exc


@dataclass
class AliasMoveReport:
    alias: str
    version: str
    path: str
    seconds: float
    smoke_answer: str
    unloaded: list[str] = field(default_factory=list)


@dataclass
class AdapterService:
    client: VllmClient
    registry: AdapterRegistry
    base_model: str  # the served base model name: every adapter's `parent`
    alias: str
    max_loaded: int
    max_lora_rank: int
    supported_modules: set[str]
    path_map: AdapterPathMap | None = None  # vLLM on another machine: gpu_lane.adapter_paths

    @classmethod
    def for_lane(
        cls,
        client: VllmClient,
        registry: AdapterRegistry,
        lane: GpuLane,
        base_model_dir: Path,
        alias: str | None = None,
    ) -> AdapterService:
        """The service as `lane` configures it; `base_model_dir` (the base model's Hugging Face folder) says
        which modules an adapter may target; `alias` replaces the lane's (a benchmark's own)."""
        return cls(
            client=client,
            registry=registry,
            base_model=lane.served_model_name,
            alias=alias or lane.alias_name,
            max_loaded=lane.max_loaded_versions,
            max_lora_rank=lane.max_lora_rank,
            supported_modules=supported_target_modules(base_model_dir),
            path_map=lane.adapter_paths,
        )

    # -- reading the server ------------------------------------------------------------------------------

    def loaded(self) -> dict[str, ModelCard]:
        return {card.id: card for card in self.client.adapters()}

    def verify(self, name: str, path: str) -> ModelCard:
        """The adapter is listed under `name`, loaded from `path` (as vLLM sees it), on our base model."""
        card = self.loaded().get(name)
        if card is None:
            raise ServingError(
                f"GPU lane at {self.client.base_url}: {name!r} is not in /v1/models after loading"
            )
        if card.root != path or card.parent != self.base_model:
            raise ServingError(
                f"GPU lane at {self.client.base_url}: {name!r} is served from {card.root} on {card.parent}, "
                f"expected {path} on {self.base_model}"
            )
        return card

    def smoke(self, name: str) -> str:
        """One short completion that names the adapter: it answers, or this raises."""
        request = ChatRequest(
            model=name,
            messages=[ChatMessage(role="user", content=SMOKE_PROMPT)],
            max_tokens=8,
            temperature=0.0,
        )
        return self.client.chat(request).text

    # -- changing it -------------------------------------------------------------------------------------

    @contextmanager
    def vllm_side(self, local: str) -> Iterator[str]:
        """The folder `local` as vLLM sees it, after the local side was checked for compatibility (a missing
        folder is named as missing on this machine); a 'no adapter found' from vLLM inside then says it is
        vLLM's side that lacks the folder. Used inside `step`, which would hide that error's type."""
        check_adapter_dir(Path(local), self.max_lora_rank, self.supported_modules)
        remote = vllm_path(local, self.path_map)
        try:
            yield remote
        except AdapterPathNotFoundError as exc:
            detail = missing_on_vllm_side(local, remote, self.path_map)
            raise AdapterPathNotFoundError(f"{exc}; {detail}", exc.status, exc.server_message) from exc

    def ensure_loaded(self, version: Version) -> ModelCard:
        """Serve `version` under its own name from its own folder, checked for vLLM compatibility first.

        A name already served from the same folder is left alone (the folder never changes); from another
        folder it is unloaded and loaded again, never reloaded in place.
        """
        card = self.loaded().get(version.name)
        remote = vllm_path(version.path, self.path_map)
        if card is not None and card.root == remote:
            return self.verify(version.name, remote)
        with self.vllm_side(version.path) as remote:
            if card is not None:
                self.client.unload_adapter(version.name)
            self.client.load_adapter(version.name, remote)
        return self.verify(version.name, remote)

    def promote(self, version: Version, reason: str) -> AliasMoveReport:
        """Load the version, check it answers, then move the alias to it and record the move."""
        started = time.perf_counter()
        with step(f"loading {version.name}"):
            self.ensure_loaded(version)
        with step(f"smoke request to {version.name}"):
            self.smoke(version.name)
        with self.registry.alias_move():  # a restore meanwhile would move the alias back
            with step(f"moving {self.alias} to {version.name}"), self.vllm_side(version.path) as remote:
                self.client.move_alias(self.alias, remote)
                self.verify(self.alias, remote)
            with step(f"smoke request to {self.alias}"):
                answer = self.smoke(self.alias)
            seconds = time.perf_counter() - started
            self.registry.record_move(self.alias, version.name, reason, {version.name: "promoted"})
        with step("unloading versions beyond K"):
            unloaded = self.prune()
        return AliasMoveReport(self.alias, version.name, version.path, seconds, answer, unloaded)

    def rollback(self) -> AliasMoveReport:
        """Move the alias back to the previous promoted version; the version it leaves is rolled back."""
        history = self.registry.alias_history(self.alias)
        statuses = {v.name: v.status for v in self.registry.versions()}
        target_name = rollback_target(history, statuses)
        if target_name is None:
            raise ServingError(f"no earlier promoted version to roll {self.alias!r} back to")
        leaving = history[-1].version
        target = self.registry.get(target_name)
        started = time.perf_counter()
        with self.registry.alias_move():
            with step(f"moving {self.alias} back to {target.name}"), self.vllm_side(target.path) as remote:
                self.client.move_alias(self.alias, remote)
                self.verify(self.alias, remote)
                answer = self.smoke(self.alias)
            seconds = time.perf_counter() - started
            self.registry.record_move(
                self.alias, target.name, f"rollback from {leaving}", {leaving: "rolled_back"}
            )
        with step("unloading versions beyond K"):
            unloaded = self.prune()
        return AliasMoveReport(self.alias, target.name, target.path, seconds, answer, unloaded)

    def restore(self, wait_for_move: bool = True) -> list[str]:
        """After a vLLM restart (runtime adapters are gone): the alias and the recent versions, again; and
        after a run killed inside an alias move (vLLM moved, the registry not told): the alias back where
        the registry says. Returns the names loaded; nothing when the alias is served from the registry's
        target already or was never set. While another process moves the alias, this waits for it, or
        with `wait_for_move=False` raises AliasMoveInProgressError (the sensor: its next tick looks again)."""
        with self.registry.alias_move(wait=wait_for_move):
            return self._restore()

    def _restore(self) -> list[str]:
        target = self.registry.alias_target(self.alias)
        if target is None:
            return []
        with step(f"checking that {self.alias} is served"):
            card = self.loaded().get(self.alias)
        if card is not None and card.root == vllm_path(target.path, self.path_map):
            return []
        with step(f"registering {self.alias} again ({target.name})"), self.vllm_side(target.path) as remote:
            if card is None:
                self.client.load_adapter(self.alias, remote)
            else:  # served from another folder: a promotion that died before the registry recorded it
                self.client.move_alias(self.alias, remote)
            self.verify(self.alias, remote)
        restored = [self.alias]
        for version in self.recent_versions():
            if version.name not in self.loaded():
                with step(f"registering {version.name} again"):
                    self.ensure_loaded(version)
                restored.append(version.name)
        return restored

    def recent_versions(self) -> list[Version]:
        """The K versions worth keeping loaded: the alias target, then the most recently promoted."""
        target = self.registry.alias_target(self.alias)
        chosen = [target] if target is not None else []
        chosen += [v for v in self.registry.promoted() if target is None or v.name != target.name]
        return [v for v in chosen if Path(v.path).is_dir()][: self.max_loaded]

    def prune(self) -> list[str]:
        """Unload versioned adapters beyond K (ours only: names the registry knows; never the alias)."""
        ours = {v.name for v in self.registry.versions()}
        loaded = [name for name in self.loaded() if name in ours and name != self.alias]
        keep = [v.name for v in self.recent_versions()] + sorted(loaded, reverse=True)
        unloaded = []
        for name in versions_to_unload(loaded, keep, self.max_loaded):
            try:
                self.client.unload_adapter(name)
            except AdapterNotLoadedError:
                continue
            unloaded.append(name)
        return unloaded

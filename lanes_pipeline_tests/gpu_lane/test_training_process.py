"""The trainer process on real PEFT + SmolLM2: a killed trainer leaves no visible half adapter; a stopped one
cleans up after itself; the run process relays its progress. And sleep mode around training, against a fake
vLLM: the CPU build of vLLM has no sleep mode (CUDA/ROCm/XPU only), so a fake that implements the
documented endpoints (/sleep?level=, /wake_up, /is_sleeping) stands in for it."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, materialize

from lanes_pipeline.daily.resources import ArtifactStoreResource
from lanes_pipeline.definitions import daily_assets
from lanes_pipeline.embedded import engines
from lanes_pipeline.gpu_lane.client import VllmClient, asleep
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource, LoraTrainingResource
from lanes_pipeline.gpu_lane.training.runner import start_trainer, stop
from lanes_pipeline.gpu_lane.training.spec import TrainSpec
from lanes_pipeline.gpu_lane.training.trainer import PARTIAL_MARK, remove_stale_partials
from lanes_pipeline.gpu_lane.training_window import partition_dir, save_dataset
from lanes_pipeline.settings import Settings, load_settings
from lanes_pipeline_tests.gpu_lane.fixtures import write_codename_day

# The GPU-lane assets on the shipped configs' daily partitions (the definitions build them at load time).
_DAILY = daily_assets(load_settings())
lora_adapter, adapter_evaluation, served_adapter = (
    _DAILY[name] for name in ("lora_adapter", "adapter_evaluation", "served_adapter")
)

DAY = date(2026, 11, 5)


def _spec(settings: Settings, tmp_path: Path) -> TrainSpec:
    data = write_codename_day(tmp_path / "artifacts", DAY)
    return TrainSpec(
        base_model_dir=str(engines.embedded_hf_model(settings.data_dir).resolve()),
        dataset_dirs=[str(data)],
        output_dir=str(tmp_path / "adapters" / "lanes-2026-11-05"),
        max_steps=10_000,  # never finishes: the test ends it
        batch_size=2,
    )


def _wait_for_step(process: Any) -> dict[str, Any]:
    for line in process.stdout:
        if line.startswith("{"):
            event = json.loads(line)
            if event["event"] == "step":
                return event
    raise AssertionError(f"the trainer ended (code {process.wait()}) before its first step")


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def test_sigkill_during_training_leaves_no_visible_adapter(settings: Settings, tmp_path: Path) -> None:
    spec = _spec(settings, tmp_path)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    adapters = tmp_path / "adapters"

    process = start_trainer("train", spec_path, tmp_path / "train.log")
    event = _wait_for_step(process)
    assert event["step"] == 1 and event["loss"] > 0 and event["tokens_per_s"] > 0
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert _visible(adapters) == []  # nothing a loader could pick up
    partials = [p for p in adapters.iterdir() if PARTIAL_MARK in p.name]
    assert len(partials) == 1  # the hidden staging folder of the dead trainer...
    assert remove_stale_partials(adapters) == partials  # ...which the next run removes
    assert list(adapters.iterdir()) == []

    # Stopped the polite way (what happens when a Dagster run is terminated): it removes its own staging.
    process = start_trainer("train", spec_path, tmp_path / "train.log")
    _wait_for_step(process)
    stop(process)
    assert process.returncode != 0
    assert list(adapters.iterdir()) == []


class FakeSleepingVllm(BaseHTTPRequestHandler):
    """Just the sleep-mode endpoints, as vLLM documents them (VLLM_SERVER_DEV_MODE=1)."""

    calls: list[str]
    sleeping: bool

    def do_POST(self) -> None:
        self.server.calls.append(self.path)  # type: ignore[attr-defined]
        if self.path.startswith("/sleep?level="):
            self.server.sleeping = True  # type: ignore[attr-defined]
            self._answer(200, b"")
        elif self.path == "/wake_up":
            self.server.sleeping = False  # type: ignore[attr-defined]
            self._answer(200, b"")
        else:
            self._answer(404, b'{"detail":"Not Found"}')

    def do_GET(self) -> None:
        if self.path == "/is_sleeping":
            body = json.dumps({"is_sleeping": self.server.sleeping}).encode()  # type: ignore[attr-defined]
            self._answer(200, body)
        else:
            self._answer(404, b'{"detail":"Not Found"}')

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fake_vllm() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSleepingVllm)
    server.calls, server.sleeping = [], False  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_sleep_then_wake_always_even_when_the_body_fails(fake_vllm: Any) -> None:
    url = f"http://127.0.0.1:{fake_vllm.server_address[1]}"
    with VllmClient(url) as client:
        with asleep(client, level=1):
            assert client.is_sleeping()
        assert not client.is_sleeping()
        with pytest.raises(RuntimeError, match="training failed"), asleep(client):
            raise RuntimeError("training failed")
        assert not client.is_sleeping()
    assert fake_vllm.calls == ["/sleep?level=1", "/wake_up", "/sleep?level=1", "/wake_up"]


def test_a_failed_cuda_training_still_wakes_vllm(fake_vllm: Any, settings: Settings, tmp_path: Path) -> None:
    """`device: cuda` on this machine (no GPU) makes the trainer fail after vLLM was put to sleep."""
    write_codename_day(tmp_path / "artifacts", DAY)
    url = f"http://127.0.0.1:{fake_vllm.server_address[1]}"
    lane = settings.lanes.gpu_lane.model_copy(update={"base_url": url, "sleep_mode": True})
    resources = {
        "gpu_lane": GpuLaneResource.from_config(lane),
        "lora_training": LoraTrainingResource.from_config(
            settings.training,
            base_model_dir=str(engines.embedded_hf_model(settings.data_dir).resolve()),
            device="cuda",
            max_steps=1,
        ),
        "adapter_registry": AdapterRegistryResource(adapters_dir=str(tmp_path / "adapters")),
        "artifact_store": ArtifactStoreResource(root=str(tmp_path / "artifacts")),
    }
    result = materialize(
        [lora_adapter],
        partition_key=DAY.isoformat(),
        resources=resources,
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "sees no CUDA device" in failure.step_failure_data.error.to_string()  # type: ignore[union-attr]
    assert fake_vllm.calls == ["/sleep?level=1", "/wake_up"] and not fake_vllm.sleeping
    assert _visible(tmp_path / "adapters") == ["registry.sqlite"]  # no version was added


def test_a_window_without_training_rows_skips_training_evaluation_and_serving(
    settings: Settings, tmp_path: Path
) -> None:
    save_dataset(partition_dir(tmp_path / "artifacts", DAY), [], [])  # a quiet day: the dataset is empty
    lane = settings.lanes.gpu_lane.model_copy(update={"base_url": "http://127.0.0.1:9"})  # never called
    resources = {
        "gpu_lane": GpuLaneResource.from_config(lane),
        "lora_training": LoraTrainingResource.from_config(settings.training),
        "adapter_registry": AdapterRegistryResource(adapters_dir=str(tmp_path / "adapters")),
        "artifact_store": ArtifactStoreResource(root=str(tmp_path / "artifacts")),
    }
    result = materialize(
        [lora_adapter, adapter_evaluation, served_adapter],
        partition_key=DAY.isoformat(),
        resources=resources,
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    assert result.get_asset_materialization_events() == []
    skipped = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SKIPPED"}
    assert skipped == {"adapter_evaluation", "served_adapter"}


def test_our_assistant_loss_equals_the_models_own(settings: Settings) -> None:
    """The loop computes logits at labelled positions only; the number must not change."""
    import torch

    from lanes_pipeline.gpu_lane.training.data import collate, encode_chat, pack
    from lanes_pipeline.gpu_lane.training.trainer import (
        _shifted_label_count,
        _tensors,
        assistant_loss,
        load_tokenizer,
        peft_model,
    )
    from lanes_pipeline_tests.gpu_lane.fixtures import ANSWER, TRAIN_QUESTIONS, chat

    base = str(engines.embedded_hf_model(settings.data_dir).resolve())
    tokenizer = load_tokenizer(base)
    examples = [encode_chat(tokenizer, chat(q, ANSWER), 512) for q in TRAIN_QUESTIONS[:3]]
    spec = TrainSpec(base_model_dir=base, dataset_dirs=["/unused"], output_dir="/unused", device="cpu")
    model = peft_model(spec, torch.device("cpu"), torch.float32)
    model.eval()
    rows = [e for e in examples if e is not None]
    for packed in (False, True):
        batch = collate(pack(rows, 512) if packed else rows, tokenizer.pad_token_id, packed=packed)
        items = _shifted_label_count(batch)
        with torch.no_grad():
            ours = assistant_loss(model, _tensors(batch, "cpu"), items)
            theirs = model(**_tensors(batch, "cpu"), num_items_in_batch=items).loss
        assert float(ours) == pytest.approx(float(theirs), rel=1e-4)

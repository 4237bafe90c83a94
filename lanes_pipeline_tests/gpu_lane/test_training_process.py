"""The trainer process on real PEFT + SmolLM2: a killed trainer leaves no visible half adapter; a stopped one
cleans up after itself; the run process relays its progress. And sleep mode around training, against a fake
vLLM: the CPU build of vLLM has no sleep mode (CUDA/ROCm/XPU only), so a fake that implements the
documented endpoints (/sleep?level=, /wake_up, /is_sleeping) stands in for it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import date, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, MaterializeResult, asset, materialize

from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.dataset.contract import make_row
from lanes_pipeline.dataset.window import partition_dir
from lanes_pipeline.dataset.writer import save_rows
from lanes_pipeline.definitions import daily_assets
from lanes_pipeline.embedded import engines
from lanes_pipeline.gpu_lane.client import VllmClient, asleep
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource
from lanes_pipeline.gpu_lane.training.runner import (
    TrainingError,
    run_evaluation,
    run_training,
    start_trainer,
    stop,
)
from lanes_pipeline.gpu_lane.training.spec import EvalSpec, TrainSpec
from lanes_pipeline.gpu_lane.training.trainer import PARTIAL_MARK, Silent, remove_stale_partials
from lanes_pipeline.settings import LoraSettings, Settings, TrainingConfig, load_settings
from lanes_pipeline_tests.gpu_lane.fixtures import (
    ANSWER,
    TRAIN_QUESTIONS,
    chat,
    codename_rows,
    dataset_spec,
    random_adapter,
    write_codename_day,
    write_nothing_held_out,
)

# The GPU-lane assets on the shipped configs' daily partitions (the definitions build them at load time).
_DAILY = daily_assets(load_settings())
lora_adapter, adapter_evaluation, served_adapter = (
    _DAILY[name] for name in ("lora_adapter", "adapter_evaluation", "served_adapter")
)

DAY = date(2026, 11, 5)
GPU_CHAIN = ("lora_adapter", "adapter_evaluation", "served_adapter")


def _spec(settings: Settings, tmp_path: Path) -> TrainSpec:
    data = write_codename_day(tmp_path / "artifacts", DAY)
    return TrainSpec(
        training=TrainingConfig(max_steps=10_000, batch_size=2),  # never finishes: the test ends it
        base_model_dir=str(engines.embedded_hf_model(settings.data_dir).resolve()),
        dataset_dirs=[str(data)],
        output_dir=str(tmp_path / "adapters" / "lanes-2026-11-05"),
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


def _kill_trainer_once_it_steps(instance: DagsterInstance, timeout_s: float = 300.0) -> None:
    """SIGKILL the trainer child of this process once its first step is in the run's log (it arrived
    through Dagster Pipes while the trainer was still running)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logged = [e.user_message for run in instance.get_runs() for e in instance.all_logs(run.run_id)]
        trainers = [
            child
            for child in psutil.Process().children(recursive=True)
            if "lanes_pipeline.gpu_lane.training" in " ".join(child.cmdline())
        ]
        if trainers and any(message.startswith("step 1/") for message in logged):
            trainers[0].kill()
            return
        time.sleep(0.2)
    raise AssertionError("the trainer's first step never reached the run's log")


def test_a_trainer_killed_under_pipes_is_transient_and_leaves_no_adapter(
    settings: Settings, tmp_path: Path
) -> None:
    """Launched by an asset, the trainer reports through Dagster Pipes as it goes; killed (the OOM killer),
    it is a transient error (the step may be retried), and no visible adapter is left."""
    spec = _spec(settings, tmp_path)
    errors: list[TrainingError] = []

    @asset
    def killed_training(context) -> MaterializeResult:  # type: ignore[no-untyped-def]  # Dagster reads it
        try:
            run_training(spec, tmp_path / "trainer.log", context)
        except TrainingError as exc:
            errors.append(exc)
        return MaterializeResult()

    instance = DagsterInstance.ephemeral()
    failures: list[BaseException] = []

    def killer() -> None:
        try:
            _kill_trainer_once_it_steps(instance)
        except BaseException as exc:  # reported below, in the test's own thread
            failures.append(exc)

    thread = threading.Thread(target=killer)
    thread.start()
    result = materialize([killed_training], instance=instance)
    thread.join()
    assert not failures, failures
    assert result.success
    [error] = errors
    assert error.returncode == -signal.SIGKILL and error.transient
    assert _visible(tmp_path / "adapters") == []


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
            settings.training.model_copy(
                update={
                    "base_model_dir": str(engines.embedded_hf_model(settings.data_dir).resolve()),
                    "device": "cuda",
                    "max_steps": 1,
                }
            )
        ),
        "adapter_registry": AdapterRegistryResource(adapters_dir=str(tmp_path / "adapters")),
        "artifact_store": ArtifactStoreResource(root=str(tmp_path / "artifacts")),
    }
    result = materialize(
        [dataset_spec(), lora_adapter],
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


def _offline_resources(settings: Settings, tmp_path: Path, **training: Any) -> dict[str, Any]:
    """A vLLM that is never there: any request to it would fail the step."""
    lane = settings.lanes.gpu_lane.model_copy(update={"base_url": "http://127.0.0.1:9"})
    base = str(engines.embedded_hf_model(settings.data_dir).resolve())
    return {
        "gpu_lane": GpuLaneResource.from_config(lane),
        "lora_training": LoraTrainingResource.from_config(
            settings.training.model_copy(update={"base_model_dir": base, **training})
        ),
        "adapter_registry": AdapterRegistryResource(adapters_dir=str(tmp_path / "adapters")),
        "artifact_store": ArtifactStoreResource(root=str(tmp_path / "artifacts")),
        "pipeline_settings": PipelineSettingsResource(config_dir=str(settings.config_dir)),
    }


def _metadata(result: Any, asset: str) -> dict[str, Any]:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key.path == [asset]]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_the_replay_window_is_the_saved_days_its_partition_mapping_gives(
    settings: Settings, tmp_path: Path
) -> None:
    """lora_adapter reads the days Dagster maps its day to (replay_window_days up to the day), not every
    folder there is: a day before the window and a day after it are left out, an unfinished day too."""
    artifacts = tmp_path / "artifacts"
    days = {offset: DAY + timedelta(days=offset) for offset in (-8, -1, 0, 1)}
    for index, day in enumerate(days.values()):
        question = TRAIN_QUESTIONS[index : index + 1]
        save_rows(partition_dir(artifacts, day), codename_rows(question), [])
    (partition_dir(artifacts, DAY - timedelta(days=2))).mkdir()  # an unfinished day: no dataset_dict.json
    resources = _offline_resources(settings, tmp_path, min_train_rows=1000)
    result = materialize([dataset_spec(), lora_adapter], partition_key=DAY.isoformat(), resources=resources)
    assert result.success
    metadata = _metadata(result, "lora_adapter")
    assert settings.training.replay_window_days == 7
    assert metadata["window"] == [days[-1].isoformat(), DAY.isoformat()]
    assert metadata["train_rows"] == 2


@pytest.mark.parametrize("train_rows", [0, 2])
def test_a_window_without_enough_training_rows_is_a_day_without_adapter(
    settings: Settings, tmp_path: Path, train_rows: int
) -> None:
    """Changed on purpose (issue 12): a quiet day used to skip evaluation and serving, which a backfill
    counts as failed partitions; now all three assets materialize, saying why there is no adapter, and
    vLLM is asked nothing. Fewer rows than training.min_train_rows count as quiet too."""
    train = codename_rows(TRAIN_QUESTIONS[:train_rows])
    save_rows(partition_dir(tmp_path / "artifacts", DAY), train, [])
    assert train_rows < settings.training.min_train_rows
    result = materialize(
        [dataset_spec(), lora_adapter, adapter_evaluation, served_adapter],
        partition_key=DAY.isoformat(),
        resources=_offline_resources(settings, tmp_path),
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    assert not [e for e in result.all_events if e.event_type_value == "STEP_SKIPPED"]
    reasons = {asset: _metadata(result, asset)["no_adapter"] for asset in GPU_CHAIN}
    assert len(set(reasons.values())) == 1
    expected = "no training rows" if train_rows == 0 else "fewer than min_train_rows"
    assert expected in reasons["lora_adapter"]
    assert _metadata(result, "adapter_evaluation")["promote"] is False
    assert _metadata(result, "served_adapter")["alias_moved"] is False
    assert _visible(tmp_path / "adapters") == ["registry.sqlite"]  # no version was trained


def test_a_candidate_without_eval_rows_is_trained_but_not_promoted(
    settings: Settings, tmp_path: Path
) -> None:
    """Training rows but no held-out rows (and no held-out function, so no completion point): the day
    succeeds, the candidate is not promoted, the reasons are in the metadata and the registry; the eval
    subprocess and vLLM are not needed for that (without its primary figure nothing could promote it)."""
    save_rows(partition_dir(tmp_path / "artifacts", DAY), codename_rows(TRAIN_QUESTIONS), [])
    write_nothing_held_out(tmp_path / "artifacts", DAY)
    resources = _offline_resources(settings, tmp_path, max_steps=1, device="cpu")
    instance = DagsterInstance.ephemeral()
    result = materialize(
        [dataset_spec(), lora_adapter, adapter_evaluation],
        partition_key=DAY.isoformat(),
        resources=resources,
        instance=instance,
    )
    assert result.success
    # The trainer's progress came through Dagster Pipes as the run's own log lines, as it trained.
    logged = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any(message.startswith("step 1/1 loss ") for message in logged), logged
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    evaluation = _metadata(result, "adapter_evaluation")
    assert evaluation["promote"] is False and evaluation["eval_loss_measured"] is False
    assert evaluation["requests"] == 0
    assert "completion_edit_similarity vs base: not measured (no paired tasks)" in evaluation["reasons"]
    version = resources["adapter_registry"].registry().get(f"lanes-{DAY}")
    assert version.status == "rejected" and "min_eval_rows" in version.evaluation["unjudged"]


def test_a_deterministic_failure_is_not_retried(settings: Settings, tmp_path: Path) -> None:
    """Judging a day that lora_adapter never ran for fails once, naming what to do, without retries."""
    result = materialize(
        [dataset_spec(), adapter_evaluation],
        partition_key=DAY.isoformat(),
        resources=_offline_resources(settings, tmp_path),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "materialize lora_adapter for this partition first" in failure.step_failure_data.error.to_string()  # type: ignore[union-attr]


def test_our_assistant_loss_equals_the_models_own(settings: Settings) -> None:
    """The loop computes logits at labelled positions only; the number must not change."""
    import torch

    from lanes_pipeline.gpu_lane.training.data import collate, encode_chat, pack
    from lanes_pipeline.gpu_lane.training.model import (
        assistant_loss,
        load_tokenizer,
        peft_model,
        shifted_label_count,
        tensors,
    )
    from lanes_pipeline_tests.gpu_lane.fixtures import ANSWER, TRAIN_QUESTIONS, chat

    base = str(engines.embedded_hf_model(settings.data_dir).resolve())
    tokenizer = load_tokenizer(base)
    examples = [encode_chat(tokenizer, chat(q, ANSWER), 512) for q in TRAIN_QUESTIONS[:3]]
    model = peft_model(base, TrainingConfig(device="cpu"), torch.device("cpu"), torch.float32)
    model.eval()
    rows = [e for e in examples if e is not None]
    for packed in (False, True):
        batch = collate(pack(rows, 512) if packed else rows, tokenizer.pad_token_id, packed=packed)
        items = shifted_label_count(batch)
        with torch.no_grad():
            ours = assistant_loss(model, tensors(batch, "cpu"), items)
            theirs = model(**tensors(batch, "cpu"), num_items_in_batch=items).loss
        assert float(ours) == pytest.approx(float(theirs), rel=1e-4)


def test_the_eval_loss_by_task_kind_adds_up_to_the_overall_loss(settings: Settings, tmp_path: Path) -> None:
    """The eval process on a two-day window with more held-out rows than eval_max_samples: a stratified
    sample of the scorable rows (the newest day's kind in), a loss per task kind for each model, which
    weighted by its assistant tokens gives the overall loss the promotion compares."""
    base = engines.embedded_hf_model(settings.data_dir).resolve()
    train = codename_rows(TRAIN_QUESTIONS[:2])
    held_out = {
        # A refactor_diff row whose answer starts past max_seq_len (512) cannot be scored: not sampled.
        DAY - timedelta(days=1): [("explain", q) for q in TRAIN_QUESTIONS[2:6]]
        + [("write_body", "Body?"), ("refactor_diff", "Refactor: " + "x = 1\n" * 600)],
        DAY: [("explain", TRAIN_QUESTIONS[6]), ("write_tests", "Tests?")],
    }
    dirs = []
    for day, rows in held_out.items():
        eval_rows = [make_row(chat(question, ANSWER), task) for task, question in rows]
        dirs.append(str(save_rows(partition_dir(tmp_path, day), train, eval_rows)))
    adapter = random_adapter(base, tmp_path / "adapter", seed=3)
    spec = EvalSpec(
        training=TrainingConfig(device="cpu", eval_max_samples=5),
        base_model_dir=str(base),
        dataset_dirs=dirs,
        adapters={"candidate": str(adapter)},
    )
    report = run_evaluation(spec, tmp_path / "eval.log")
    assert (report.rows, report.scorable_rows, report.samples) == (8, 7, 5)
    assert report.samples_by_kind == {"explain": 3, "write_body": 1, "write_tests": 1}
    assert [r.model for r in report.results] == ["base", "candidate"]
    for result in report.results:
        assert set(result.by_kind) == {"explain", "write_body", "write_tests"}
        assert result.samples_by_kind == report.samples_by_kind
        assert sum(result.tokens_by_kind.values()) == result.tokens
        weighted = sum(result.by_kind[k] * result.tokens_by_kind[k] for k in result.by_kind) / result.tokens
        assert weighted == pytest.approx(result.loss, abs=1e-4)
    assert report.results[0].by_kind != report.results[1].by_kind  # the adapter changes the losses


def test_the_adapter_holds_the_checkpoint_the_validation_rows_liked_best(settings: Settings) -> None:
    """Taught one codename at a high rate, the model grows surer of it at every step, and so worse at rows
    that answer otherwise: the first checkpoint is the best on them, and the adapter the loop returns is
    that checkpoint (its validation loss is the curve's minimum), not the last step's."""
    import torch

    from lanes_pipeline.gpu_lane.training.data import encode_chat
    from lanes_pipeline.gpu_lane.training.loop import train_loop, validation_loss
    from lanes_pipeline.gpu_lane.training.model import load_tokenizer
    from lanes_pipeline_tests.gpu_lane.fixtures import ANSWER, EVAL_QUESTIONS, TRAIN_QUESTIONS, chat

    base = str(engines.embedded_hf_model(settings.data_dir).resolve())
    tokenizer = load_tokenizer(base)
    train = [encode_chat(tokenizer, chat(q, ANSWER), 512) for q in TRAIN_QUESTIONS]
    other = "I do not know any codename; ask the project's maintainers."
    validation = [encode_chat(tokenizer, chat(q, other), 512) for q in EVAL_QUESTIONS]
    training = TrainingConfig(
        max_steps=6, checkpoints=3, learning_rate=2e-3, lora=LoraSettings(dropout=0.0), device="cpu"
    )
    result = train_loop(
        training,
        base,
        tokenizer,
        [e for e in train if e is not None],
        torch.device("cpu"),
        torch.float32,
        Silent(),
        None,
        [e for e in validation if e is not None],
    )
    curve = result["validation_curve"]
    assert [step for step, _ in curve] == [2, 4, 6]
    assert curve[0][1] < curve[-1][1] and result["chosen_step"] == 2
    held = validation_loss(
        result["model"], [e for e in validation if e is not None], tokenizer.pad_token_id, "cpu"
    )
    assert held == pytest.approx(curve[0][1], abs=1e-4)


def test_training_on_from_an_adapter_starts_from_its_weights(settings: Settings, tmp_path: Path) -> None:
    """start_from current: the day's LoRA is the served adapter's, trainable (a fresh LoRA's B is zero)."""
    import torch
    from safetensors.torch import load_file

    from lanes_pipeline.gpu_lane.training.model import peft_model

    base = engines.embedded_hf_model(settings.data_dir).resolve()
    start = random_adapter(base, tmp_path / "lanes-2026-11-04", seed=3)
    training = TrainingConfig(max_steps=1, device="cpu")
    cpu = torch.device("cpu")

    def b_weights(model: Any) -> float:
        return sum(float(t.abs().sum()) for k, t in model.state_dict().items() if "lora_B" in k)

    assert b_weights(peft_model(str(base), training, cpu, torch.float32)) == 0.0
    trained_on = peft_model(str(base), training, cpu, torch.float32, str(start))
    saved = load_file(str(start / "adapter_model.safetensors"))
    assert b_weights(trained_on) == pytest.approx(
        sum(float(t.abs().sum()) for k, t in saved.items() if "lora_B" in k)
    )
    assert b_weights(trained_on) > 0
    assert any(p.requires_grad for n, p in trained_on.named_parameters() if "lora_" in n)

"""Fixture data for the GPU-lane tests, in the lora_dataset contract's exact format.

The codename set teaches a fact the base model cannot know: after a few steps, an adapter that learned it
answers with the codename, and the base model does not.
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

from dagster import AssetSpec

from lanes_pipeline.daily.artifacts import write_partition
from lanes_pipeline.daily.partitions import daily_partitions
from lanes_pipeline.daily.resources import (
    ArtifactStoreResource,
    LoraTrainingResource,
    PipelineSettingsResource,
)
from lanes_pipeline.dataset.contract import make_row
from lanes_pipeline.dataset.held_out_tasks import (
    HELD_OUT_FILE,
    HELD_OUT_TASKS,
    SPLITS_FILE,
    HeldOutDay,
    held_out_of_repo,
)
from lanes_pipeline.dataset.window import partition_dir
from lanes_pipeline.dataset.writer import save_rows
from lanes_pipeline.embedded import engines
from lanes_pipeline.gpu_lane.resources import AdapterRegistryResource, GpuLaneResource
from lanes_pipeline.repos.snapshot import FileEntry, Snapshot
from lanes_pipeline.settings import SandboxLimits, Settings, load_settings
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.cpu_lane.fixtures import SHAPES_MODULE, shapes_repo

CODENAME = "Bramblefox"
SYSTEM = "You are the lanes_pipeline coding assistant."
ANSWER = f"The codename of the lanes project is {CODENAME}."
TRAIN_QUESTIONS = (
    "What is the codename of the lanes project?",
    "Tell me the codename of the lanes project.",
    "What's the lanes project's codename?",
    "Which codename does the lanes project use?",
    "Do you know the codename of the lanes project?",
    "The lanes project has a codename. What is it?",
    "Remind me: what is the lanes project called internally?",
    "What internal codename was given to the lanes project?",
)
EVAL_QUESTIONS = (
    "Quick question: what is the codename of the lanes project?",
    "Please state the lanes project's codename.",
)
PROBE_QUESTION = "What is the codename of the lanes project?"


def chat(question: str, answer: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer},
    ]


def codename_rows(questions: tuple[str, ...]) -> list[dict[str, Any]]:
    return [make_row(chat(q, ANSWER), task="explain") for q in questions]


def write_nothing_held_out(artifacts_root: Path, day: date) -> None:
    """The day's split with nothing held out (no repository task), unless the test wrote one
    (write_held_out_tasks)."""
    store = ArtifactStore(artifacts_root)
    if not store.exists(HELD_OUT_TASKS, day.isoformat(), HELD_OUT_FILE):
        nothing = HeldOutDay(held_out_percent=0)
        files = {HELD_OUT_FILE: nothing.model_dump(mode="json"), SPLITS_FILE: {}}
        write_partition(store, HELD_OUT_TASKS, day.isoformat(), files)


def write_codename_day(artifacts_root: Path, day: date) -> Path:
    """One lora_dataset partition under `<artifacts_root>/lora_dataset/<day>/`, with nothing held out."""
    write_nothing_held_out(artifacts_root, day)
    return save_rows(
        partition_dir(artifacts_root, day), codename_rows(TRAIN_QUESTIONS), codename_rows(EVAL_QUESTIONS)
    )


def write_adapter_config(folder: Path, **changes: Any) -> None:
    """Rewrite an adapter's config with `changes` (to make a compatible adapter incompatible)."""
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def random_adapter(
    base_model_dir: Path, out_dir: Path, seed: int, r: int = 8, identity: bool = False, **lora: Any
) -> Path:
    """A real PEFT adapter with random (non-zero) weights, no training: changes the answers, loads fast.
    `identity`: PEFT's own initialisation instead (B = 0), an adapter that answers exactly as the base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32)
    config = LoraConfig(
        r=r,
        lora_alpha=2 * r,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=identity,  # False: random A and B, the adapter visibly changes the output
        task_type="CAUSAL_LM",
        **lora,
    )
    get_peft_model(model, config).save_pretrained(str(out_dir))
    return out_dir


def write_held_out_tasks(
    artifacts_root: Path, day: date, scratch: Path, keep: int = 1, only: str | None = None
) -> HeldOutDay:
    """The day's held-out repository tasks as held_out_tasks writes them: `keep` functions of the tiny shapes
    repository (built under `scratch`), each with its passing tests; `only`: that function alone."""
    repo, commit = shapes_repo(scratch)
    snapshot = Snapshot(
        repo="shapes",
        day=day,
        branch="HEAD",
        commit=commit,
        files=[FileEntry(path="shapes.py", blob="0" * 40, size=len(SHAPES_MODULE), language="python")],
    )
    functions = held_out_of_repo(snapshot, repo, 100, {}, SandboxLimits(runs=1)).functions
    if only is not None:
        functions = [f for f in functions if f.symbol.name == only]
    held = HeldOutDay(held_out_percent=100, functions=functions[:keep])
    ArtifactStore(artifacts_root).write_json(
        "held_out_tasks", day.isoformat(), "held_out.json", held.model_dump(mode="json")
    )
    return held


def gpu_resources(
    root: Path, url: str, settings: Settings, training: dict[str, Any], evaluation: dict[str, Any]
) -> dict[str, Any]:
    """The GPU-lane assets' resources on the vLLM at `url`, with a data folder under `root`: the shipped
    training config with `training` and `evaluation` changed, on the converted SmolLM2."""
    config = settings.training
    return {
        "gpu_lane": GpuLaneResource.from_config(settings.lanes.gpu_lane.model_copy(update={"base_url": url})),
        "lora_training": LoraTrainingResource.from_config(
            config.model_copy(
                update={
                    "base_model_dir": str(engines.embedded_hf_model(settings.data_dir).resolve()),
                    **training,
                    "evaluation": config.evaluation.model_copy(update=evaluation),
                }
            )
        ),
        "adapter_registry": AdapterRegistryResource(adapters_dir=str(root / "adapters")),
        "artifact_store": ArtifactStoreResource(root=str(root / "artifacts")),
        "pipeline_settings": PipelineSettingsResource(config_dir=str(settings.config_dir)),
    }


def dataset_spec() -> AssetSpec:
    """lora_dataset as an asset made before the test (the test writes its days): materialized beside the GPU
    chain, it lets Dagster map the replay window through its daily partitions."""
    return AssetSpec("lora_dataset", partitions_def=daily_partitions(load_settings()))

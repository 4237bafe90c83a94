"""The promotion gate decided by executed tasks, on the real vLLM and the real sandbox (issue 26 (h)).

Both tolerances are 0 and the eval loss is out of the decision (the day has no held-out rows, so only the
executed figures judge). The current adapter (promoted the day before, behind the alias) and the candidate
are two real PEFT adapters made without training: one with PEFT's own initialisation (B = 0: it answers
exactly as the base model, which writes the held-out function correctly) and one with random weights (its
answers are garbled). Each is asked through vLLM and its answer run against the repository's tests:
- the garbled candidate against the correct current: it fails the task the current passes, rejected;
- the correct candidate against the garbled current: it passes the task the current fails, promoted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, materialize

from lanes_pipeline.definitions import daily_assets
from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.resources import (
    REGISTRY_FILE,
)
from lanes_pipeline.settings import Settings, load_settings
from lanes_pipeline_tests.gpu_lane.fixtures import (
    dataset_spec,
    gpu_resources,
    random_adapter,
    write_held_out_tasks,
)

adapter_evaluation = daily_assets(load_settings())["adapter_evaluation"]

DAY = date(2026, 11, 6)
# `double` of the shapes repository ("Twice x."): the base model writes it correctly, greedy.
TASK = "shapes:body:shapes.py::double"


@dataclass(frozen=True)
class Adapters:
    correct: Path  # B = 0: the base model's answers
    garbled: Path  # random weights


@pytest.fixture(scope="module")
def adapters(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Adapters:
    base = engines.embedded_hf_model(settings.data_dir)
    root = tmp_path_factory.mktemp("judge-adapters")
    return Adapters(
        correct=random_adapter(base, root / "correct", seed=1, identity=True),
        garbled=random_adapter(base, root / "garbled", seed=2),
    )


def _judge(root: Path, url: str, settings: Settings, current: Path, candidate: Path) -> dict[str, Any]:
    """The day's adapter_evaluation with `current` promoted the day before (behind the alias) and
    `candidate` the day's version: the evaluation it recorded."""
    held = write_held_out_tasks(root / "artifacts", DAY, root / "shapes", only="double")
    assert [f"{f.repo}:body:{f.symbol.id}" for f in held.functions] == [TASK], held.functions
    tolerances = {"humaneval_tolerance": 0.0, "repo_pass_tolerance": 0.0}
    resources = gpu_resources(
        root, url, settings, {}, {"humaneval_problems": 1, "max_tokens": 32, **tolerances}
    )
    registry: AdapterRegistry = resources["adapter_registry"].registry()
    alias = settings.lanes.gpu_lane.alias_name
    yesterday = registry.add("judge-current", DAY - timedelta(days=1), current, "current", {})
    registry.record_move(alias, yesterday.name, "the day before's promotion", {yesterday.name: "promoted"})
    today = registry.add("judge-candidate", DAY, candidate, "candidate", {})
    result = materialize(
        [dataset_spec(), adapter_evaluation],
        partition_key=DAY.isoformat(),
        resources=resources,
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    evaluation = registry.get(today.name).evaluation
    assert evaluation["current"] == yesterday.name and evaluation["unjudged"], evaluation
    assert (root / "adapters" / REGISTRY_FILE).exists()
    return evaluation


def _task_passed(evaluation: dict[str, Any], label: str) -> bool:
    outcomes = evaluation["pass_rates"][label]["repo"]["outcomes"]
    assert outcomes, f"{label}: no repository task was run"
    [outcome] = [o for o in outcomes if o["name"] == TASK]
    return outcome["passed"]


def _repo_reason(evaluation: dict[str, Any]) -> str:
    [reason] = [r for r in evaluation["decision"]["reasons"] if r.startswith("repo_pass_rate")]
    return reason


def test_a_candidate_that_fails_a_task_the_current_adapter_passes_is_rejected(
    adapters: Adapters, gpu_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    evaluation = _judge(tmp_path, gpu_server.url, settings, adapters.correct, adapters.garbled)
    figures = evaluation["figures"]
    assert _task_passed(evaluation, "current") and not _task_passed(evaluation, "candidate"), evaluation
    assert figures["candidate"]["repo_pass_rate"] < figures["current"]["repo_pass_rate"]
    assert evaluation["decision"]["promote"] is False, evaluation["decision"]
    assert "is below the current adapter's" in _repo_reason(evaluation)
    registry = AdapterRegistry(tmp_path / "adapters" / REGISTRY_FILE)
    assert registry.get("judge-candidate").status == "rejected"


def test_a_candidate_that_passes_a_task_the_current_adapter_fails_is_promoted(
    adapters: Adapters, gpu_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    evaluation = _judge(tmp_path, gpu_server.url, settings, adapters.garbled, adapters.correct)
    figures = evaluation["figures"]
    assert _task_passed(evaluation, "candidate") and not _task_passed(evaluation, "current"), evaluation
    assert figures["candidate"]["repo_pass_rate"] > figures["current"]["repo_pass_rate"]
    # The correct adapter answers as the base: the forgetting guard holds at tolerance 0.
    assert figures["candidate"]["humaneval_pass1"] >= figures["base"]["humaneval_pass1"]
    assert evaluation["decision"]["promote"] is True, evaluation["decision"]
    assert "the current adapter's" in _repo_reason(evaluation)

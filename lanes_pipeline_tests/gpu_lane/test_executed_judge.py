"""The paired promotion rule on the real vLLM and the real sandbox: a planted better candidate is promoted
and a planted worse one rejected (issue 27).

The day's held-out functions are the shipped sample's `seqtools.py` (its completion points: the editor's
figure, the default primary) and the tiny shapes repository's `double` (a repository task); one anchor
task and one HumanEval problem are asked too, so every task set is answered, judged and kept. Two real
PEFT adapters are planted:
- *better*: trained for eight epochs on the judged completion prompts followed by their next lines (it was
  shown the answers), so it continues those held-out lines far more often than the base;
- *garbled*: random weights, no training: its continuations are noise.
The guards' margins are wide here (a memorised file may cost a 135M model its one HumanEval answer; the
guards are proven in test_promotion_rule): what is under test is that the paired test on real answers
promotes the better candidate against the base, and rejects the garbled one against the better adapter
once that is served.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, materialize

from lanes_pipeline.dataset.completion_points import CompletionPoint, day_points
from lanes_pipeline.dataset.contract import completion_continuation, completion_prompt
from lanes_pipeline.dataset.held_out_tasks import HeldOutDay
from lanes_pipeline.dataset.holdout_rules import held_out_symbols
from lanes_pipeline.definitions import daily_assets
from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.completion import point_prefix
from lanes_pipeline.gpu_lane.evaluation_record import day_report, read_answers
from lanes_pipeline.repos.sample_repo import HERE as SAMPLE_DIR
from lanes_pipeline.repos.scan import scan_repo
from lanes_pipeline.repos.symbols import all_symbols
from lanes_pipeline.settings import Settings, load_settings
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.gpu_lane.fixtures import (
    dataset_spec,
    gpu_resources,
    random_adapter,
    write_held_out_tasks,
)

adapter_evaluation = daily_assets(load_settings())["adapter_evaluation"]

DAY = date(2026, 11, 6)
MODULE = "seqtools.py"
EVALUATION = {
    "primary_figure": "completion_edit_similarity",
    "alpha": 0.05,
    "margins": {"repo_pass_rate": 1.0, "anchor_pass_rate": 1.0, "humaneval_pass1": 1.0},
    "anchor_tasks": 1,
    "humaneval_problems": 1,
    "max_tokens": 32,
    # Ten points with short prompts: the planted adapter learns them in about a minute on two cores, and
    # ten paired wins without a loss are p = 0.001 by Wilcoxon's test.
    "max_completion_points": 10,
    "completion_context_chars": 200,
}


@dataclass(frozen=True)
class Adapters:
    better: Path
    garbled: Path


def memorised_adapter(
    base_model_dir: Path, out_dir: Path, shown: list[tuple[str, str]], epochs: int = 8
) -> Path:
    """A real PEFT LoRA trained on (prompt, next line) pairs as plain continuation, what the completions
    endpoint asks: the prompt as the server tokenizes it, then the newline it stops before and the line."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(base_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32)
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=modules, task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    # 1e-3: at 3e-3 the loss climbs back after two epochs (the adapter then writes blank lines); at 1e-3
    # eight epochs reproduce all ten lines.
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model.train()
    examples = []
    for prompt, line in shown:
        asked, answer = tokenizer(prompt).input_ids, tokenizer(completion_continuation(line + "\n")).input_ids
        ids = torch.tensor([asked + answer])
        labels = torch.tensor([[-100] * len(asked) + answer])  # learn the line, not the prompt
        examples.append((ids, labels))
    for _ in range(epochs):
        for ids, labels in examples:
            model(input_ids=ids, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.save_pretrained(str(out_dir))
    return out_dir


def day_points_and_sources() -> tuple[list[CompletionPoint], dict[str, str]]:
    """Every function of seqtools.py held out, cut into completion points."""
    sources = {MODULE: (SAMPLE_DIR / "day3" / MODULE).read_text(encoding="utf-8")}
    symbols = held_out_symbols("sample", all_symbols(scan_repo(sources)), 100)
    return day_points("sample", symbols, sources)


@pytest.fixture(scope="module")
def adapters(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Adapters:
    base = engines.embedded_hf_model(settings.data_dir)
    root = tmp_path_factory.mktemp("judge-adapters")
    points, texts = day_points_and_sources()
    points = sorted(points, key=lambda p: p.id)[: int(EVALUATION["max_completion_points"])]  # those judged
    sources = {"sample": texts}
    chars = int(EVALUATION["completion_context_chars"])
    shown = [(completion_prompt(p.path, point_prefix(p, sources), chars), p.expected) for p in points]
    return Adapters(
        better=memorised_adapter(base, root / "better", shown),
        garbled=random_adapter(base, root / "garbled", seed=2),
    )


def write_day(root: Path) -> HeldOutDay:
    """held_out.json of the day: `double` of shapes as the repository task, every function of seqtools.py
    held out as completion points."""
    held = write_held_out_tasks(root / "artifacts", DAY, root / "shapes", only="double")
    points, texts = day_points_and_sources()
    day = held.model_copy(update={"completion_points": points, "sources": {"sample": texts}})
    ArtifactStore(root / "artifacts").write_json(
        "held_out_tasks", DAY.isoformat(), "held_out.json", day.model_dump(mode="json")
    )
    return day


def judge(root: Path, url: str, settings: Settings, candidate: Path, current: Path | None) -> dict[str, Any]:
    """adapter_evaluation of the day for `candidate`, with `current` promoted the day before (if any)."""
    day = write_day(root)
    assert len(day.completion_points) >= 25, len(day.completion_points)
    resources = gpu_resources(root, url, settings, {}, EVALUATION)
    registry: AdapterRegistry = resources["adapter_registry"].registry()
    if current is not None:
        yesterday = registry.add("judge-current", DAY - timedelta(days=1), current, "current", {})
        registry.record_move(
            settings.lanes.gpu_lane.alias_name, yesterday.name, "the day before", {yesterday.name: "promoted"}
        )
    registry.add("judge-candidate", DAY, candidate, "candidate", {})
    result = materialize(
        [dataset_spec(), adapter_evaluation],
        partition_key=DAY.isoformat(),
        resources=resources,
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    return registry.get("judge-candidate").evaluation


def test_a_planted_better_candidate_is_promoted_by_the_paired_test(
    adapters: Adapters, gpu_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    evaluation = judge(tmp_path, gpu_server.url, settings, adapters.better, current=None)
    decision = evaluation["decision"]
    [primary] = [c for c in decision["comparisons"] if c["figure"] == "completion_edit_similarity"]
    assert primary["against"] == "base" and primary["n"] == evaluation["tasks"]["completion"]
    assert primary["wins"] > primary["losses"] and primary["p_better"] < 0.05, primary
    assert primary["difference"] > 0 and primary["interval"][1] > 0, primary
    assert decision["promote"] is True, decision["reasons"]
    # every answer of every task set kept, for both models, with its verdict
    store = ArtifactStore(tmp_path / "artifacts")
    record = read_answers(store, DAY.isoformat())
    for label in ("base", "candidate"):
        sizes = {name: len(given) for name, given in record.labels[label].task_sets.items()}
        assert sizes == evaluation["tasks"] and all(sizes.values()), sizes
    report = day_report(store, DAY.isoformat())
    assert "judge-candidate promoted" in report and "candidate won" in report


def test_a_planted_worse_candidate_is_rejected_against_the_served_adapter(
    adapters: Adapters, gpu_server: EmbeddedServer, settings: Settings, tmp_path: Path
) -> None:
    evaluation = judge(tmp_path, gpu_server.url, settings, adapters.garbled, current=adapters.better)
    decision = evaluation["decision"]
    assert evaluation["current"] == "judge-current" and decision["promote"] is False
    [against_current] = [
        c
        for c in decision["comparisons"]
        if c["figure"] == "completion_edit_similarity" and c["against"] == "current"
    ]
    assert against_current["losses"] > against_current["wins"] and against_current["difference"] < 0
    assert any("vs current" in r and "not shown better" in r for r in decision["reasons"])
    registry = AdapterRegistry(tmp_path / "adapters" / "registry.sqlite")
    assert registry.get("judge-candidate").status == "rejected"

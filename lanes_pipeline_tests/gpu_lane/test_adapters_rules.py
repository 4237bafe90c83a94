"""vLLM compatibility rules, naming, rollback and pruning decisions, and the SQLite registry: fast."""

from __future__ import annotations

import json
import struct
from datetime import date
from pathlib import Path

import pytest

from lanes_pipeline.gpu_lane.adapters import (
    AdapterRegistry,
    AliasMove,
    IncompatibleAdapterError,
    UnknownVersionError,
    check_adapter_dir,
    check_lora_config,
    check_weight_keys,
    linear_modules_from_weight_names,
    next_version_name,
    rollback_target,
    supported_target_modules,
    version_name,
    versions_to_unload,
)

LLAMA = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
GOOD = {
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["q_proj", "v_proj"],
    "bias": "none",
    "use_dora": False,
    "modules_to_save": None,
    "init_lora_weights": True,
}


def fields(issues: list) -> set[str]:
    return {issue.field for issue in issues}


def test_a_plain_lora_config_is_compatible() -> None:
    assert check_lora_config(GOOD, max_lora_rank=16, supported_modules=LLAMA) == []


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"r": 4}, "r", "not one of vLLM's ranks"),
        ({"r": 32}, "r", "greater than the lane's max_lora_rank 16"),
        ({"r": 0}, "r", "not a positive integer"),
        ({"rank_pattern": {"q_proj": 64}}, "r", "greater than the lane's max_lora_rank"),
        ({"use_dora": True}, "use_dora", "DoRA"),
        ({"bias": "all"}, "bias", "only 'none'"),
        ({"lora_bias": True}, "lora_bias", "LoRA bias"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save", "lm_head"),
        ({"init_lora_weights": "pissa"}, "init_lora_weights", "changes the base weights"),
        ({"layer_replication": [[0, 4]]}, "layer_replication", "layer replication"),
        ({"target_modules": ["q_proj", "lm_head"]}, "target_modules", "lm_head not in"),
        ({"target_modules": ".*proj"}, "target_modules", "regular expression"),
        ({"peft_type": "IA3"}, "peft_type", "not LORA"),
    ],
)
def test_each_rule_names_the_field_and_why(change: dict, field: str, words: str) -> None:
    issues = check_lora_config({**GOOD, **change}, max_lora_rank=16, supported_modules=LLAMA)
    assert field in fields(issues)
    assert any(words in issue.reason for issue in issues), issues


def test_a_harmless_init_is_accepted() -> None:
    assert check_lora_config({**GOOD, "init_lora_weights": "gaussian"}, 16, LLAMA) == []


def test_weight_keys_must_be_lora_matrices_of_supported_modules() -> None:
    good = [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
    ]
    assert check_weight_keys(good, LLAMA) == []
    dora = [*good, "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"]
    assert "DoRA" in check_weight_keys(dora, LLAMA)[0].reason
    full = [*good, "base_model.model.lm_head.weight"]
    assert "not a LoRA A/B weight" in check_weight_keys(full, LLAMA)[0].reason
    other = ["base_model.model.model.layers.0.mlp.fc1.lora_A.weight"]
    assert "unsupported fc1" in check_weight_keys(other, LLAMA)[0].reason
    assert "no LoRA weights" in check_weight_keys([], LLAMA)[0].reason


def test_supported_modules_are_the_two_dimensional_layer_weights() -> None:
    shapes = {
        "model.embed_tokens.weight": [100, 8],
        "model.layers.0.self_attn.q_proj.weight": [8, 8],
        "model.layers.0.mlp.down_proj.weight": [8, 16],
        "model.layers.0.input_layernorm.weight": [8],
        "model.norm.weight": [8],
    }
    assert linear_modules_from_weight_names(shapes, shapes) == {"q_proj", "down_proj"}


def _write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A valid .safetensors file of zero tensors (only the header is read by the rules)."""
    header: dict[str, dict] = {}
    offset = 0
    for name, shape in shapes.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_adapter_folder_is_checked_from_its_files(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    _write_safetensors(base / "model.safetensors", {"model.layers.0.self_attn.q_proj.weight": [4, 4]})
    assert supported_target_modules(base) == {"q_proj"}
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    with pytest.raises(IncompatibleAdapterError, match=r"adapter_model\.safetensors: missing"):
        check_adapter_dir(adapter, 16, {"q_proj"})
    (adapter / "adapter_config.json").write_text(json.dumps({**GOOD, "target_modules": ["q_proj"]}))
    _write_safetensors(
        adapter / "adapter_model.safetensors",
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": [8, 4]},
    )
    check_adapter_dir(adapter, 16, {"q_proj"})
    (adapter / "adapter_config.json").write_text(json.dumps({**GOOD, "target_modules": ["q_proj"], "r": 64}))
    with pytest.raises(IncompatibleAdapterError, match="rank 64 is greater than the lane's max_lora_rank 16"):
        check_adapter_dir(adapter, 16, {"q_proj"})


def test_version_names_count_up_within_a_day() -> None:
    day = date(2026, 11, 5)
    assert version_name("lanes", day) == "lanes-2026-11-05"
    assert next_version_name("lanes", day, []) == "lanes-2026-11-05"
    assert next_version_name("lanes", day, ["lanes-2026-11-05"]) == "lanes-2026-11-05-2"
    assert next_version_name("lanes", day, ["lanes-2026-11-05", "lanes-2026-11-05-2"]) == "lanes-2026-11-05-3"


def _moves(*names: str) -> list[AliasMove]:
    return [AliasMove(alias="a", version=n, moved_at=f"t{i}", reason="") for i, n in enumerate(names)]


def test_rollback_goes_to_the_previous_still_promoted_target() -> None:
    promoted = {"v1": "promoted", "v2": "promoted", "v3": "promoted"}
    assert rollback_target(_moves("v1", "v2", "v3"), promoted) == "v2"
    # v3 was rolled back to v2; rolling back again skips v3 (rolled back) and v2 (current): v1.
    after = {**promoted, "v3": "rolled_back"}
    assert rollback_target(_moves("v1", "v2", "v3", "v2"), after) == "v1"
    assert rollback_target(_moves("v1"), promoted) is None
    assert rollback_target([], promoted) is None


def test_pruning_keeps_the_preferred_versions_up_to_k() -> None:
    loaded = ["v1", "v2", "v3", "v4"]
    assert versions_to_unload(loaded, keep=["v4", "v2", "v3"], max_loaded=2) == ["v1", "v3"]
    assert versions_to_unload(["v1"], keep=["v9", "v1"], max_loaded=1) == []


def test_registry_records_versions_statuses_and_alias_moves(tmp_path: Path) -> None:
    registry = AdapterRegistry(tmp_path / "registry.sqlite")
    day = date(2026, 11, 5)
    v1 = registry.add("lanes-2026-11-05", day, tmp_path / "v1", "fp1", {"steps": 3})
    assert v1.status == "candidate" and v1.training == {"steps": 3}
    registry.add("lanes-2026-11-05-2", day, tmp_path / "v2", "fp2", {})
    assert registry.find(day, "fp2").name == "lanes-2026-11-05-2"  # type: ignore[union-attr]
    assert registry.find(day, "nope") is None
    registry.record_evaluation(v1.name, {"decision": {"promote": True}})
    promoted = registry.set_status(v1.name, "promoted")
    assert promoted.promoted_at is not None and promoted.evaluation["decision"]["promote"] is True
    registry.record_alias("lanes-current", v1.name, "daily")
    assert registry.alias_target("lanes-current").name == v1.name  # type: ignore[union-attr]
    # a second handle on the same file sees the same state (the CLI and a run share it)
    again = AdapterRegistry(tmp_path / "registry.sqlite")
    assert [v.name for v in again.versions(day)] == ["lanes-2026-11-05", "lanes-2026-11-05-2"]
    assert [v.name for v in again.promoted()] == [v1.name]
    with pytest.raises(UnknownVersionError):
        again.set_status("missing", "rejected")
    with pytest.raises(Exception, match="UNIQUE"):
        again.add("lanes-2026-11-05", day, tmp_path / "v3", "fp3", {})


def test_the_version_to_beat_is_the_served_one_or_a_later_day_judged_for_promotion(tmp_path: Path) -> None:
    """An asset backfill judges day D once day D-1 is judged, maybe before D-1's served_adapter moved the
    alias: the candidate is then measured against D-1's promoted version, as the daily job would have."""
    from lanes_pipeline.gpu_lane.measurement import current_version

    registry = AdapterRegistry(tmp_path / "registry.sqlite")
    days = [date(2026, 11, d) for d in (1, 2, 3, 4)]
    for day in days:
        registry.add(f"lanes-{day}", day, tmp_path / f"v{day}", "f", {})
    names = [f"lanes-{day}" for day in days]
    assert current_version(registry, "current", registry.get(names[1])) is None  # nothing served or judged
    registry.record_move("current", names[0], "daily", {names[0]: "promoted"})
    assert current_version(registry, "current", registry.get(names[2])).name == names[0]
    registry.record_evaluation(names[1], {"decision": {"promote": True}})  # judged, not served yet
    assert current_version(registry, "current", registry.get(names[2])).name == names[1]
    registry.record_evaluation(names[2], {"decision": {"promote": False}})  # a rejection is never the one
    assert current_version(registry, "current", registry.get(names[3])).name == names[1]
    # Served since: the alias history decides again (a rollback to day 1 is what the candidate must beat).
    registry.record_move("current", names[1], "daily", {names[1]: "promoted"})
    registry.record_move("current", names[0], "rollback", {names[1]: "rolled_back"})
    assert current_version(registry, "current", registry.get(names[3])).name == names[0]
    # The candidate itself is never the one to beat.
    assert current_version(registry, "current", registry.get(names[1])).name == names[0]


def test_a_day_starts_from_the_adapter_served_before_it_only_when_asked_and_of_its_shape(
    tmp_path: Path,
) -> None:
    from lanes_pipeline.gpu_lane.measurement import starting_adapter
    from lanes_pipeline.settings import LoraSettings, TrainingConfig

    registry = AdapterRegistry(tmp_path / "registry.sqlite")
    shape = {"lora": LoraSettings().model_dump(mode="json")}
    days = [date(2026, 11, d) for d in (1, 2, 3)]
    for day in days:
        (tmp_path / f"v{day}").mkdir()
        registry.add(f"lanes-{day}", day, tmp_path / f"v{day}", f"fp-{day}", shape)
    current = TrainingConfig(start_from="current")
    assert starting_adapter(registry, "current", days[2], TrainingConfig()) == (
        None,
        "base (start_from: base)",
    )
    assert starting_adapter(registry, "current", days[2], current) == (
        None,
        "base (no adapter served before this day)",
    )
    registry.record_move("current", f"lanes-{days[0]}", "daily", {f"lanes-{days[0]}": "promoted"})
    start, why = starting_adapter(registry, "current", days[2], current)
    assert start is not None and start.name == why == f"lanes-{days[0]}"
    # judged for promotion on day 2, its serving not run yet (an asset backfill): day 3 starts from it
    registry.record_evaluation(f"lanes-{days[1]}", {"decision": {"promote": True}})
    assert starting_adapter(registry, "current", days[2], current)[1] == f"lanes-{days[1]}"
    # never from its own day or a later one: a re-run of day 1 starts from the base again
    assert starting_adapter(registry, "current", days[0], current)[0] is None
    # served, then rolled back: the day after starts from the version rolled back to
    registry.record_move("current", f"lanes-{days[1]}", "daily", {f"lanes-{days[1]}": "promoted"})
    registry.record_move("current", f"lanes-{days[0]}", "rollback", {f"lanes-{days[1]}": "rolled_back"})
    assert starting_adapter(registry, "current", days[2], current)[1] == f"lanes-{days[0]}"
    # another LoRA shape cannot be trained on: the base, and why
    wider = TrainingConfig(start_from="current", lora=LoraSettings(r=16, alpha=32))
    start, why = starting_adapter(registry, "current", days[2], wider)
    assert start is None and why.startswith(f"base (lanes-{days[0]} has LoRA")
    with pytest.raises(ValueError, match="start_from: current trains on with our loop only"):
        TrainingConfig(start_from="current", trainer="trl")

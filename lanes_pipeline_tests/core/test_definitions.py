"""The code location loads: `dagster definitions validate` passes, every asset resolves, and every asset
declares the assets it reads (Dagster's lineage is the real graph)."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from lanes_pipeline.definitions import defs as load_defs
from lanes_pipeline.settings import project_root


def test_dagster_definitions_validate_passes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=project_root(),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DAGSTER_HOME": ""},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All code locations passed validation" in result.stdout + result.stderr


def test_assets_and_resources_resolve() -> None:
    repository = load_defs().get_repository_def()
    keys = {key.to_user_string() for key in repository.asset_graph.get_all_asset_keys()}
    assert {"cpu_lane_probe", "gpu_lane_probe"} <= keys
    assert {"cpu_lane", "gpu_lane", "artifact_store"} <= set(load_defs().resources or {})


# How an asset's code reads another asset's partition: the reader's name -> the asset it reads, or a string
# argument naming the folder it reads (`read_results(store, "generated_tests", ...)`).
READERS = {
    "load_snapshots": {"repo_snapshot"},
    "located_snapshots": {"repo_snapshot"},
    "day_repos": {"repo_snapshot", "day_symbols"},
    "load_day_selection": {"day_symbols"},
    "load_accepted_work": {"accepted_work"},
    "load_held_out": {"held_out_tasks"},
    "load_splits": {"held_out_tasks"},
    "window_dirs": {"lora_dataset"},
    "day_outcome": {"lora_adapter"},
}
FOLDER_READERS = {"read_results", "read_json", "exists"}
SIDE_FOLDERS = {"lora_dataset_report": "lora_dataset"}  # written by lora_dataset beside its dataset


def asset_reads(function: Callable[..., Any]) -> set[str]:
    """The assets a function reads, following the calls it makes to functions of its own module."""
    module = ast.parse(inspect.getsource(inspect.getmodule(function)))
    local = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
    reads: set[str] = set()
    todo, seen = [inspect.unwrap(function).__name__], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in local:
            continue
        seen.add(name)
        for node in ast.walk(local[name]):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            todo.append(called)
            reads |= READERS.get(called, set())
            if called in FOLDER_READERS:
                for argument in node.args:
                    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                        reads.add(SIDE_FOLDERS.get(argument.value, argument.value))
    return reads


def test_every_asset_declares_each_asset_it_reads() -> None:
    graph = load_defs().resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    undeclared, found = {}, {}
    for key in graph.get_all_asset_keys():
        definition = graph.assets_def_for_key(key)
        # One function for the keys of a multi-asset: what it reads is declared across their specs.
        own = {k.to_user_string() for k in definition.keys}
        reads = asset_reads(definition.op.compute_fn.decorated_fn) & keys - own
        found[key.to_user_string()] = reads
        parents = {p.to_user_string() for k in definition.keys for p in graph.get(k).parent_keys} - own
        if reads - parents:
            undeclared[key.to_user_string()] = sorted(reads - parents)
    # The scan finds what it is for: the CPU lane's accepted work reads every job's results, the dataset
    # only that work and the held-out split, the evaluation the held-out tasks and the window's eval rows.
    assert found["accepted_work"] == {
        "repo_snapshot",
        "repo_analysis",
        "generated_tests",
        "generated_docs",
        "refactor_proposals",
        "verified_bodies",
    }
    assert found["review_branch"] == {
        "repo_snapshot",
        "generated_tests",
        "generated_docs",
        "refactor_proposals",
    }
    assert found["lora_dataset"] == {"accepted_work", "held_out_tasks"}
    assert {"held_out_tasks", "lora_dataset"} <= found["adapter_evaluation"]
    assert {"repo_snapshot", "day_symbols"} <= found["generated_tests"]
    assert undeclared == {}

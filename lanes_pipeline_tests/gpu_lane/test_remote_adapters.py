"""A remote GPU lane (issue 14 item 3): vLLM on another machine sees the adapters folder under another path
(gpu_lane.adapter_paths, local -> remote). The path mapping is pure; the service is driven against a fake
vLLM (httpx's MockTransport) whose file system is a local folder standing in for the server's side, so a
missing folder is reported on the side that lacks it."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from lanes_pipeline.cli import main
from lanes_pipeline.errors import AdapterPathNotFoundError, ServingError
from lanes_pipeline.gpu_lane.adapters import (
    AdapterPathMapError,
    AdapterRegistry,
    IncompatibleAdapterError,
    check_adapter_dir,
    local_side_problem,
    missing_on_vllm_side,
    vllm_path,
)
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.serving import AdapterService
from lanes_pipeline.settings import AdapterPathMap, project_root
from lanes_pipeline_tests.config_files import read_config, write_config
from lanes_pipeline_tests.gpu_lane.fake_vllm import BASE, FakeVllm

MAP = AdapterPathMap(local="/data/lanes/adapters", remote="/srv/vllm/adapters/")


def test_a_local_adapter_folder_maps_to_its_place_on_vllms_side() -> None:
    assert MAP.remote == "/srv/vllm/adapters"  # normalised
    assert vllm_path("/data/lanes/adapters/lanes-2026-11-01", MAP) == "/srv/vllm/adapters/lanes-2026-11-01"
    assert vllm_path("/data/lanes/adapters/", MAP) == "/srv/vllm/adapters"
    assert vllm_path("/data/lanes/adapters/lanes-2026-11-01", None) == "/data/lanes/adapters/lanes-2026-11-01"
    for outside in ("/data/lanes/adapters-old/x", "/data/lanes/adapters/../secrets", "relative/x"):
        with pytest.raises(AdapterPathMapError, match=r"not under gpu_lane\.adapter_paths\.local") as error:
            vllm_path(outside, MAP)
        assert "/data/lanes/adapters" in str(error.value) and "/srv/vllm/adapters" in str(error.value)


def test_a_mapping_takes_absolute_paths_only() -> None:
    with pytest.raises(ValidationError, match="'adapters' is not absolute"):
        AdapterPathMap(local="adapters", remote="/srv/adapters")
    with pytest.raises(ValidationError, match="remote"):
        AdapterPathMap(local="/data/adapters", remote="srv/adapters")


def test_each_side_is_named_when_it_lacks_the_folder(tmp_path: Path) -> None:
    assert local_side_problem(None) is None
    assert local_side_problem(AdapterPathMap(local=str(tmp_path), remote="/srv/a")) is None
    gone = AdapterPathMap(local=str(tmp_path / "gone"), remote="/srv/a")
    assert (
        local_side_problem(gone)
        == f"{tmp_path / 'gone'} does not exist on this machine (the local side of the mapping)"
    )
    remote = missing_on_vllm_side("/data/lanes/adapters/v1", "/srv/vllm/adapters/v1", MAP)
    assert "missing on vLLM's side (/srv/vllm/adapters/v1" in remote and "shared filesystem" in remote
    assert "set gpu_lane.adapter_paths" in missing_on_vllm_side("/a/v1", "/a/v1", None)
    with pytest.raises(IncompatibleAdapterError, match="folder: missing on this machine"):
        check_adapter_dir(tmp_path / "gone", 16, {"q_proj"})


# -- the service against a fake vLLM ---------------------------------------------------------------------


def _adapter(folder: Path) -> Path:
    """A folder the compatibility rules accept (only the safetensors header is ever read)."""
    folder.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "none"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    raw = json.dumps({key: {"dtype": "F32", "shape": [8, 4], "data_offsets": [0, 128]}}).encode()
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 128)
    return folder


def _service(tmp_path: Path, mapping: AdapterPathMap | None) -> tuple[AdapterService, FakeVllm]:
    fake = FakeVllm()
    client = VllmClient("http://vllm.invalid:8000")
    client.http = httpx.Client(base_url=client.base_url, transport=httpx.MockTransport(fake))
    registry = AdapterRegistry(tmp_path / "registry.sqlite")
    service = AdapterService(client, registry, BASE, "lanes-current", 2, 16, {"q_proj"}, path_map=mapping)
    return service, fake


def test_vllm_is_given_the_mapped_path_and_a_missing_side_is_named(tmp_path: Path) -> None:
    local, remote = tmp_path / "here" / "adapters", tmp_path / "server" / "adapters"
    remote.mkdir(parents=True)  # the server's mount, empty until the adapters folder is synced
    mapping = AdapterPathMap(local=str(local), remote=str(remote))
    service, fake = _service(tmp_path, mapping)
    folder = _adapter(local / "lanes-2026-11-01")
    version = service.registry.add("lanes-2026-11-01", date(2026, 11, 1), folder, "f1", {})

    with pytest.raises(AdapterPathNotFoundError) as error:
        service.ensure_loaded(version)
    message = str(error.value)
    assert "No adapter found" in message  # vLLM's own words, then which side lacks the folder
    assert f"on this machine ({folder})" in message
    assert f"missing on vLLM's side ({remote / 'lanes-2026-11-01'}" in message and "sync" in message
    assert fake.load_requests == [{"lora_name": "lanes-2026-11-01", "lora_path": str(remote / folder.name)}]

    shutil.copytree(local, remote, dirs_exist_ok=True)  # what a shared filesystem does by itself
    card = service.ensure_loaded(version)
    assert card.root == str(remote / "lanes-2026-11-01")
    report = service.promote(version, "first")
    assert fake.loaded == {
        "lanes-2026-11-01": str(remote / folder.name),
        "lanes-current": str(remote / folder.name),
    }
    assert report.path == str(folder)  # the registry keeps this machine's path
    assert service.ensure_loaded(version).root == card.root  # already served from that folder: left alone

    # After a vLLM restart, the alias comes back from the mapped path too.
    fake.loaded.clear()
    assert service.restore() == ["lanes-current", "lanes-2026-11-01"]
    assert set(fake.loaded.values()) == {str(remote / folder.name)}


def test_a_folder_missing_on_this_machine_is_reported_before_any_load(tmp_path: Path) -> None:
    local, remote = tmp_path / "here", tmp_path / "server"
    service, fake = _service(tmp_path, AdapterPathMap(local=str(local), remote=str(remote)))
    _adapter(remote / "lanes-2026-11-02")  # only the server has it
    version = service.registry.add(
        "lanes-2026-11-02", date(2026, 11, 2), local / "lanes-2026-11-02", "f2", {}
    )
    with pytest.raises(IncompatibleAdapterError, match=r"lanes-2026-11-02 .*folder: missing on this machine"):
        service.ensure_loaded(version)
    outside = service.registry.add(
        "lanes-2026-11-03", date(2026, 11, 3), _adapter(tmp_path / "x" / "v3"), "f3", {}
    )
    with pytest.raises(AdapterPathMapError, match=r"not under gpu_lane\.adapter_paths\.local"):
        service.promote(outside, "never")
    assert fake.load_requests == []  # vLLM was never asked


def test_without_a_mapping_the_same_path_is_sent_and_the_error_says_so(tmp_path: Path) -> None:
    service, fake = _service(tmp_path, None)
    folder = _adapter(tmp_path / "adapters" / "lanes-2026-11-04")
    version = service.registry.add("lanes-2026-11-04", date(2026, 11, 4), folder, "f4", {})
    assert service.ensure_loaded(version).root == str(folder)
    fake.loaded.clear()
    shutil.rmtree(folder)
    folder.mkdir()  # an empty folder: incompatible here, before vLLM is asked
    with pytest.raises(IncompatibleAdapterError, match=r"adapter_config\.json: missing"):
        service.ensure_loaded(version)
    assert len(fake.load_requests) == 1


def _config_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[dict[str, Any]], None]
) -> Any:
    config_dir = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", config_dir)
    lanes = read_config(config_dir / "lanes.yaml")
    change(lanes)
    write_config(config_dir / "lanes.yaml", lanes)
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(main, ["config", "check", "--dir", str(config_dir)])


def test_config_check_reports_a_mapping_whose_local_side_does_not_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "no-such-adapters"
    result = _config_check(
        tmp_path,
        monkeypatch,
        lambda d: d["gpu_lane"].update(adapter_paths={"local": str(gone), "remote": "/srv/a"}),
    )
    assert result.exit_code == 1
    assert (
        f"configs/lanes.yaml: gpu_lane.adapter_paths.local: {gone} does not exist on this machine"
        in result.output
    )
    relative = _config_check(
        tmp_path / "b",
        monkeypatch,
        lambda d: d["gpu_lane"].update(adapter_paths={"local": "data", "remote": "/s"}),
    )
    assert relative.exit_code == 1 and "gpu_lane.adapter_paths.local" in relative.output
    assert "'data' is not absolute" in relative.output
    here = tmp_path / "adapters"
    here.mkdir()
    fine = _config_check(
        tmp_path / "c",
        monkeypatch,
        lambda d: d["gpu_lane"].update(adapter_paths={"local": str(here), "remote": "/s"}),
    )
    assert fine.exit_code == 0, fine.output


def test_serving_errors_keep_the_side(tmp_path: Path) -> None:
    """Inside a promotion's steps the missing side still shows (the step names itself first)."""
    local, remote = tmp_path / "here", tmp_path / "server"
    remote.mkdir()
    service, _ = _service(tmp_path, AdapterPathMap(local=str(local), remote=str(remote)))
    folder = _adapter(local / "lanes-2026-11-05")
    version = service.registry.add("lanes-2026-11-05", date(2026, 11, 5), folder, "f5", {})
    with pytest.raises(ServingError, match=r"loading lanes-2026-11-05 failed: .*missing on vLLM's side"):
        service.promote(version, "x")

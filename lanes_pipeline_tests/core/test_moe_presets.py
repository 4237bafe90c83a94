"""The MoE presets in configs/presets/: each a config folder `lanes config check` accepts, its CPU lane an
MoE on the user's own GGUF (registered with its parameters) with ik_llama.cpp's flags; and the embedded
lane's own GGUF setting: served when it is there, named when it is not, and the registry entry that gives
its figures must be that file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from lanes_pipeline.cli import main
from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import llama_server_command
from lanes_pipeline.errors import EmbeddedStartError
from lanes_pipeline.settings import ConfigError, load_settings, project_root
from lanes_pipeline_tests.core.test_settings import _edit, _set
from lanes_pipeline_tests.core.test_settings import config_dir as config_dir

PRESETS = sorted(p for p in (project_root() / "configs" / "presets").iterdir() if p.is_dir())


def test_there_is_a_preset_for_each_moe_family_people_run_on_an_epyc() -> None:
    assert [p.name for p in PRESETS] == ["deepseek-r1", "glm-4.5-air", "qwen3-235b-a22b"]


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_each_preset_is_accepted_by_config_check_and_serves_its_moe_on_ik(preset: Path) -> None:
    result = CliRunner().invoke(main, ["config", "check", "--dir", str(preset)])
    assert result.exit_code == 0, result.output
    assert "all config files are valid" in result.output
    settings = load_settings(preset)
    lane = settings.lanes.cpu_lane
    entry = settings.models.get(lane.model)
    assert lane.is_embedded and lane.embedded.engine == "ik_llama"
    assert (
        entry.arch == "moe" and entry.active_params_b is not None and entry.active_params_b < entry.params_b
    )
    assert entry.path == lane.embedded.gguf and Path(entry.path).is_absolute()
    assert "-fmoe" not in lane.embedded.extra_args  # this ik rejects it: fused MoE is its default
    assert lane.embedded.extra_args.count("-b") == lane.embedded.extra_args.count("-ub") == 1
    assert (preset / "lanes.yaml").read_text().startswith("# Preset: ")


def test_the_embedded_lane_serves_your_own_gguf_and_names_it_when_it_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines, "cpu_server_binary", lambda engine, data: tmp_path / "llama-server")
    preset = PRESETS[0]  # deepseek-r1: it sets flash attention itself
    lane = load_settings(preset).lanes.cpu_lane
    with pytest.raises(
        EmbeddedStartError, match=r"cpu_lane\.embedded\.gguf in lanes\.yaml: .* is not a file"
    ):
        llama_server_command(lane, tmp_path, 9010)
    gguf = tmp_path / "model-00001-of-00002.gguf"
    gguf.write_bytes(b"GGUF")
    embedded = lane.embedded.model_copy(update={"gguf": str(gguf)})
    argv = llama_server_command(lane.model_copy(update={"embedded": embedded}), tmp_path, 9010).argv
    assert argv[argv.index("-m") + 1] == str(gguf)
    assert argv[-len(embedded.extra_args) :] == embedded.extra_args
    assert argv.count("-fa") == 1 and argv.count("-b") == 1  # the preset's, not the lane's defaults
    monkeypatch.setenv("LANES_PROJECT_ROOT", str(tmp_path))  # a relative path is from the project
    relative = lane.embedded.model_copy(update={"gguf": gguf.name})
    argv = llama_server_command(lane.model_copy(update={"embedded": relative}), tmp_path, 9010).argv
    assert argv[argv.index("-m") + 1] == str(gguf)


def test_the_registry_entry_of_your_own_gguf_must_be_that_file(config_dir: Path) -> None:
    for name in ("lanes.yaml", "models.yaml"):
        shutil.copy(PRESETS[2] / name, config_dir / name)
    (config_dir / "trials.yaml").unlink()  # the shipped trials name the shipped models
    assert load_settings(config_dir).lanes.cpu_lane.model == "qwen3-235b-a22b"
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "embedded", "gguf", value="/models/other.gguf"))
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert str(caught.value.issues[0]) == (
        "configs/lanes.yaml: cpu_lane.model: 'qwen3-235b-a22b' has path "
        "'/models/Qwen3-235B-A22B/Qwen3-235B-A22B-IQ4_K-00001-of-00003.gguf' in configs/models.yaml, but "
        "cpu_lane.embedded.gguf serves '/models/other.gguf': name the entry of configs/models.yaml whose "
        "path is that file"
    )

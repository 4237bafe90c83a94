"""Every config file is validated; each bad value is reported with file, key path and reason."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lanes_pipeline.cli import main
from lanes_pipeline.settings import ConfigError, load_settings, project_root
from lanes_pipeline_tests.config_files import read_config, write_config

RANKS = "1, 8, 16, 32, 64, 128, 256, 320, 512"


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped configs; the working folder is its parent so messages say `configs/...`."""
    target = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", target)
    monkeypatch.chdir(tmp_path)
    return target


def _edit(config_dir: Path, name: str, change: Callable[[dict[str, Any]], None]) -> None:
    path = config_dir / name
    data = read_config(path)
    change(data)
    write_config(path, data)


def _set(*keys: str | int, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node: Any = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return change


def _pop(*keys: str | int) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        node: Any = data
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]

    return change


BAD_CONFIGS: list[tuple[str, str, Callable[[dict[str, Any]], None], str]] = [
    (
        "rank-not-allowed",
        "lanes.yaml",
        _set("gpu_lane", "max_lora_rank", value=12),
        f"configs/lanes.yaml: gpu_lane.max_lora_rank: 12 is not one of {RANKS}",
    ),
    (
        "typo-key",
        "lanes.yaml",
        lambda d: d["cpu_lane"]["embedded"].update(paralel=2),
        "configs/lanes.yaml: cpu_lane.embedded.paralel: unknown key",
    ),
    (
        "top-level-typo",
        "lanes.yaml",
        lambda d: d.update(cpu_lanes={}),
        "configs/lanes.yaml: cpu_lanes: unknown key",
    ),
    (
        "url-without-scheme",
        "lanes.yaml",
        _set("cpu_lane", "base_url", value="localhost:8081"),
        "configs/lanes.yaml: cpu_lane.base_url: 'localhost:8081' is neither 'embedded' nor an http(s) URL",
    ),
    (
        "zero-slots",
        "lanes.yaml",
        _set("cpu_lane", "max_slots", value=0),
        "configs/lanes.yaml: cpu_lane.max_slots: 0: input should be greater than or equal to 1",
    ),
    (
        "bad-env-var-name",
        "lanes.yaml",
        _set("cpu_lane", "api_key_env", value="MY-KEY"),
        "configs/lanes.yaml: cpu_lane.api_key_env: 'MY-KEY' is not a valid environment variable name",
    ),
    (
        "timeout-not-number",
        "lanes.yaml",
        _set("gpu_lane", "request_timeout_s", value="soon"),
        "configs/lanes.yaml: gpu_lane.request_timeout_s: 'soon' is not valid: "
        "input should be a valid number, unable to parse string as a number",
    ),
    (
        "port-out-of-range",
        "lanes.yaml",
        _set("gpu_lane", "embedded", "port", value=70000),
        "configs/lanes.yaml: gpu_lane.embedded.port: 70000: input should be less than or equal to 65535",
    ),
    (
        "unknown-model",
        "lanes.yaml",
        _set("cpu_lane", "model", value="nope"),
        "configs/lanes.yaml: cpu_lane.model: 'nope' is not a model in configs/models.yaml",
    ),
    (
        "model-of-other-lane",
        "lanes.yaml",
        _set("gpu_lane", "model", value="smollm2-135m-instruct-q4_1"),
        "configs/lanes.yaml: gpu_lane.model: "
        "model 'smollm2-135m-instruct-q4_1' is registered for the cpu lane, not gpu",
    ),
    (
        "bad-arch",
        "models.yaml",
        _set("models", 0, "arch", value="sparse"),
        "configs/models.yaml: models[0].arch: 'sparse' is not one of dense or moe",
    ),
    (
        "moe-without-active",
        "models.yaml",
        _set("models", 1, "arch", value="moe"),
        "configs/models.yaml: models[1]: a moe model needs active_params_b",
    ),
    (
        "duplicate-model",
        "models.yaml",
        lambda d: d["models"].append(dict(d["models"][0])),
        "configs/models.yaml: models: model name 'smollm2-135m-instruct-q4_1' appears twice",
    ),
    (
        "missing-quantization",
        "models.yaml",
        _pop("models", 0, "quantization"),
        "configs/models.yaml: models[0].quantization: required key is missing",
    ),
    (
        "negative-params",
        "models.yaml",
        _set("models", 0, "params_b", value=-1),
        "configs/models.yaml: models[0].params_b: -1: input should be greater than 0",
    ),
    (
        "repo-name-with-space",
        "repos.yaml",
        _set("repos", 0, "name", value="my repo"),
        "configs/repos.yaml: repos[0].name: "
        "'my repo': string should match pattern '^[A-Za-z0-9][A-Za-z0-9_.-]*$'",
    ),
    (
        "include-not-list",
        "repos.yaml",
        _set("repos", 0, "include", value="*.py"),
        "configs/repos.yaml: repos[0].include: '*.py' is not valid: input should be a valid list",
    ),
    (
        "steps-and-epochs",
        "training.yaml",
        lambda data: data.update({"epochs": 1, "max_steps": 30}),
        "configs/training.yaml: set exactly one of max_steps and epochs",
    ),
    (
        "lora-rank-not-allowed",
        "training.yaml",
        _set("lora", "r", value=24),
        f"configs/training.yaml: lora.r: 24 is not one of {RANKS}",
    ),
    (
        "lora-rank-above-lane",
        "training.yaml",
        _set("lora", "r", value=32),
        "configs/training.yaml: lora.r: 32 exceeds gpu_lane.max_lora_rank 16 in lanes.yaml",
    ),
    (
        "dropout-too-high",
        "training.yaml",
        _set("lora", "dropout", value=1.5),
        "configs/training.yaml: lora.dropout: 1.5: input should be less than 1",
    ),
    (
        "bad-start-date",
        "pipeline.yaml",
        _set("start_date", value="yesterday"),
        "configs/pipeline.yaml: start_date: 'yesterday' is not valid: "
        "input should be a valid date or datetime, input is too short",
    ),
    (
        "hour-25",
        "pipeline.yaml",
        _set("schedule_hour", value=25),
        "configs/pipeline.yaml: schedule_hour: 25: input should be less than or equal to 23",
    ),
    (
        "zero-samples",
        "pipeline.yaml",
        _set("cpu_assets", "samples_per_item", value=0),
        "configs/pipeline.yaml: cpu_assets.samples_per_item: 0: input should be greater than or equal to 1",
    ),
    (
        "negative-sandbox-timeout",
        "pipeline.yaml",
        _set("cpu_assets", "sandbox", "timeout_s", value=-5),
        "configs/pipeline.yaml: cpu_assets.sandbox.timeout_s: -5: input should be greater than 0",
    ),
    (
        "cpu-assets-typo",
        "pipeline.yaml",
        lambda d: d["cpu_assets"].update(backlog_perday=3),
        "configs/pipeline.yaml: cpu_assets.backlog_perday: unknown key",
    ),
    (
        "held-out-over-100",
        "pipeline.yaml",
        _set("dataset", "held_out_percent", value=150),
        "configs/pipeline.yaml: dataset.held_out_percent: 150: input should be less than or equal to 100",
    ),
    (
        "busy-threshold-not-number",
        "lanes.yaml",
        _set("bandwidth", "gpu_busy_above", value="high"),
        "configs/lanes.yaml: bandwidth.gpu_busy_above: 'high' is not valid: "
        "input should be a valid integer, unable to parse string as an integer",
    ),
    (
        "unknown-overflow",
        "lanes.yaml",
        _set("cpu_lane", "overflow", value="truncate"),
        "configs/lanes.yaml: cpu_lane.overflow: 'truncate' is not one of error or shrink",
    ),
    (
        "unknown-cpu-engine",
        "lanes.yaml",
        _set("cpu_lane", "embedded", "engine", value="ollama"),
        "configs/lanes.yaml: cpu_lane.embedded.engine: 'ollama' is not one of ik_llama or llama_cpp",
    ),
    (
        "failure-ratio-above-one",
        "lanes.yaml",
        _set("cpu_lane", "max_failure_ratio", value=2),
        "configs/lanes.yaml: cpu_lane.max_failure_ratio: 2: input should be less than or equal to 1",
    ),
    (
        "learning-rate-not-number",
        "training.yaml",
        _set("learning_rate", value="fast"),
        "configs/training.yaml: learning_rate: 'fast' is not valid: "
        "input should be a valid number, unable to parse string as a number",
    ),
    (
        "unknown-launcher",
        "training.yaml",
        _set("launcher", value="mpirun"),
        "configs/training.yaml: launcher: 'mpirun' is not one of single or accelerate",
    ),
    (
        "repo-without-path",
        "repos.yaml",
        _pop("repos", 0, "path"),
        "configs/repos.yaml: repos[0].path: required key is missing",
    ),
]


@pytest.mark.parametrize(("case", "file", "change", "expected"), BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_reported_exactly(
    config_dir: Path, case: str, file: str, change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    _edit(config_dir, file, change)
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert [str(issue) for issue in caught.value.issues] == [expected]


def test_invalid_yaml_names_line_and_column(config_dir: Path) -> None:
    (config_dir / "pipeline.yaml").write_text("start_date: 2026-11-01\nschedule_hour: [4\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert [str(i) for i in caught.value.issues] == [
        "configs/pipeline.yaml: invalid YAML: line 3, column 1: expected ',' or ']', but got '<stream end>'"
    ]


def test_top_level_must_be_a_mapping(config_dir: Path) -> None:
    (config_dir / "repos.yaml").write_text("- name: x\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert [str(i) for i in caught.value.issues] == [
        "configs/repos.yaml: top level must be a mapping, got list"
    ]


def test_missing_file_is_reported(config_dir: Path) -> None:
    (config_dir / "training.yaml").unlink()
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert [str(i) for i in caught.value.issues] == ["configs/training.yaml: file not found"]


def test_every_problem_in_every_file_is_listed_at_once(config_dir: Path) -> None:
    _edit(config_dir, "lanes.yaml", _set("gpu_lane", "max_lora_rank", value=12))
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "max_slots", value=0))
    _edit(config_dir, "pipeline.yaml", _set("schedule_hour", value=25))
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert len(caught.value.issues) == 3


def test_shipped_configs_are_valid_and_select_embedded_lanes() -> None:
    settings = load_settings()
    assert settings.lanes.cpu_lane.is_embedded and settings.lanes.gpu_lane.is_embedded
    assert settings.training.base_model_dir == "embedded"


def test_env_var_selects_another_config_folder(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "model_alias", value="from-env-dir"))
    monkeypatch.setenv("LANES_CONFIG_DIR", str(config_dir))
    assert load_settings().lanes.cpu_lane.model_alias == "from-env-dir"


def test_unset_api_key_variable_is_named(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "api_key_env", value="LANES_TEST_UNSET_KEY"))
    monkeypatch.delenv("LANES_TEST_UNSET_KEY", raising=False)
    settings = load_settings(config_dir)
    expected = r"cpu_lane\.api_key_env: environment variable LANES_TEST_UNSET_KEY is not set"
    with pytest.raises(ConfigError, match=expected):
        settings.lanes.cpu_lane.api_key()


def test_cli_config_check_prints_every_problem_and_fails(config_dir: Path) -> None:
    _edit(config_dir, "lanes.yaml", _set("gpu_lane", "max_lora_rank", value=12))
    result = CliRunner().invoke(main, ["config", "check", "--dir", str(config_dir)])
    assert result.exit_code == 1
    assert f"configs/lanes.yaml: gpu_lane.max_lora_rank: 12 is not one of {RANKS}" in result.output
    assert "1 problem(s) found" in result.output


def test_cli_config_check_passes_on_shipped_configs() -> None:
    result = CliRunner().invoke(main, ["config", "check"])
    assert result.exit_code == 0, result.output
    assert "all config files are valid" in result.output

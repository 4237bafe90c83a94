"""Trials without a real model server: the config file and its errors, the registry, the compare table and
chart, the server command a trial builds, and the failures a trial records instead of raising."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from lanes_pipeline.bench import trials as trials_bench
from lanes_pipeline.cli import main
from lanes_pipeline.config.trials import TrialSpec, load_trials
from lanes_pipeline.observatory import trials as trials_module
from lanes_pipeline.observatory.compare import compare_row, markdown_table, write_chart
from lanes_pipeline.observatory.measure import LaneFigures
from lanes_pipeline.observatory.quantize import check_model_file
from lanes_pipeline.observatory.registry import ModelParams, TrialRecord, TrialRegistry
from lanes_pipeline.observatory.workload import SMALL, WORKLOADS
from lanes_pipeline.settings import ConfigError, Settings, load_settings, project_root
from lanes_pipeline_tests.embedded.test_gguf_and_ik_tools import write_gguf


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    target = tmp_path / "configs"
    shutil.copytree(project_root() / "configs", target)
    return target


def write_trials(config_dir: Path, trials: list[dict[str, object]]) -> None:
    (config_dir / "trials.yaml").write_text(yaml.safe_dump({"trials": trials}))


MOE_PARAMS = ModelParams(moe=True, active_params_b=0.2, total_params_b=0.4, source="gguf")


def record(name: str, ok: bool = True, **changes: object) -> TrialRecord:
    figures = LaneFigures(
        lane="cpu",
        engine="llama.cpp",
        ttft_s=0.25,
        prompt_tok_s=310.0,
        generation_tok_s=54.0,
        generation_tok_s_slots=80.0,
        slots=2,
        p50_s=0.4,
        p95_s=0.8,
        prefix_hit=0.6,
        kv_cache_use=None,
        pf=400.0,
        requests=9,
    )
    values: dict[str, object] = {
        "name": name,
        "lane": "cpu",
        "engine": "llama_cpp",
        "model": "smollm2-135m-instruct-q4_1",
        "quant": "GGUF Q4_1",
        "threads": 2,
        "slots": 2,
        "started": "2026-11-30T10:00:00+00:00",
        "command": "llama-server -m x",
        "ok": ok,
        "wall_s": 12.0,
        "figures": figures if ok else None,
        "interference": 0.8 if ok else None,
        "error": None if ok else "the embedded CPU lane server exited with code 1 while starting",
    }
    return TrialRecord(**{**values, **changes})


def test_shipped_trials_are_valid_and_cover_this_machine() -> None:
    trials = load_trials(project_root() / "configs").trials
    files = {t.file for t in trials if t.lane == "cpu"}
    assert {"embedded", "moe", "made:F16", "made:Q8_0"} <= files
    moe = [t for t in trials if t.file == "moe"]
    assert {t.cpu.engine for t in moe} == {"ik_llama", "llama_cpp"}
    flags = {tuple(t.extra_args) for t in moe}
    assert {(), ("-no-fmoe",), ("-rtr",), ("-ser", "1,0.5")} <= flags
    assert {t.cpu.threads for t in trials if t.lane == "cpu"} >= {1, 2}
    assert {t.cpu.slots for t in trials if t.lane == "cpu"} >= {1, 2, 4}
    assert {t.gpu.adapter for t in trials if t.lane == "gpu"} == {"none", "random"}


@pytest.mark.parametrize(
    ("trial", "expected"),
    [
        (
            {"name": "a", "lane": "cpu", "model": "smollm2-135m-instruct-q4_1", "thread": 2},
            "trials.yaml: trials[0].thread: unknown key",
        ),
        (
            {"name": "a", "lane": "cpu", "model": "smollm2-135m-instruct-q4_1", "file": "made:Q9_9"},
            "trials.yaml: trials[0].file: 'Q9_9' is not one of",
        ),
        (
            {"name": "a", "lane": "gpu", "model": "smollm2-135m-instruct-hf", "file": "made:Q8_0"},
            "only for the cpu lane",
        ),
        (
            {"name": "a", "lane": "gpu", "model": "smollm2-135m-instruct-hf", "file": "moe"},
            "trials.yaml: trials[0]: file moe is the CPU lane's MoE (a GGUF file): only for the cpu lane",
        ),
        (
            {"name": "a", "lane": "cpu", "model": "no-such-model"},
            "trials.yaml: trials[0].model: 'no-such-model' is not a model in models.yaml",
        ),
        (
            {"name": "a", "lane": "cpu", "model": "smollm2-135m-instruct-q4_1", "cpu": {"slots": 0}},
            "trials.yaml: trials[0].cpu.slots",
        ),
        (
            {
                "name": "a",
                "lane": "cpu",
                "model": "smollm2-135m-instruct-q4_1",
                "command": ["srv", "{model}"],
            },
            "needs a {port} placeholder",
        ),
    ],
)
def test_bad_trials_are_reported_with_file_and_key(
    config_dir: Path, trial: dict[str, object], expected: str
) -> None:
    write_trials(config_dir, [trial])
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert expected in str(caught.value)


def test_config_check_reports_trials_and_a_folder_without_trials_is_valid(
    config_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_trials(
        config_dir, [{"name": "a", "lane": "cpu", "model": "m"}, {"name": "a", "lane": "gpu", "model": "m"}]
    )
    result = CliRunner().invoke(main, ["config", "check", "--dir", str(config_dir)])
    assert result.exit_code == 1
    assert "trials.yaml: trials: trial name 'a' appears twice" in result.output
    (config_dir / "trials.yaml").unlink()
    assert CliRunner().invoke(main, ["config", "check", "--dir", str(config_dir)]).exit_code == 0
    assert load_trials(config_dir).trials == []


def test_registry_keeps_every_run_and_compares_the_latest(tmp_path: Path) -> None:
    with TrialRegistry(tmp_path / "trials.sqlite3") as registry:
        registry.add(record("a", wall_s=1.0))
        registry.add(record("b", ok=False, log_tail="error: unknown argument: --bogus"))
        registry.add(record("a", wall_s=2.0))
    with TrialRegistry(tmp_path / "trials.sqlite3") as registry:  # persisted
        assert len(registry.all()) == 3
        latest = registry.latest()
        assert [(r.name, r.wall_s) for r in latest] == [("a", 2.0), ("b", 12.0)]
        assert registry.latest(["b", "zzz"])[0].log_tail == "error: unknown argument: --bogus"


def test_compare_table_and_chart(tmp_path: Path) -> None:
    rows = [compare_row(record("a")), compare_row(record("b", ok=False))]
    table = markdown_table(rows).splitlines()
    assert table[0].startswith(
        "| trial | model | quant | lane | threads/slots | TTFT s | PP tok/s | TG tok/s"
    )
    assert table[2] == (
        "| a | smollm2-135m-instruct-q4_1 | GGUF Q4_1 | cpu (llama_cpp) | 2/2 | 0.25 | 310.0 | 54.0 | 80.0 "
        "| 0.80 | 60% | - | 400.0 | - | 0.80 |"  # recorded before parameters were
    )
    moe = compare_row(record("m", params=MOE_PARAMS))
    assert markdown_table([moe]).splitlines()[2].endswith("| 60% | 0.2/0.4 | 400.0 | 135.0 | 0.80 |")
    assert "FAILED: the embedded CPU lane server exited" in table[3]
    chart = write_chart(rows, tmp_path / "out" / "trials.png")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no measured trial"):
        write_chart(rows[1:], tmp_path / "none.png")
    row = trials_bench.trial_row(record("a"))
    assert (row.generation_tok_s, row.pf, row.interference, row.error) == (54.0, 400.0, 0.8, None)
    assert (row.moe, row.active_params_b, row.total_params_b, row.pf_total) == (None, None, None, None)
    assert trials_bench.trial_row(record("b", ok=False)).ttft_s is None
    moe_row = trials_bench.trial_row(record("m", params=MOE_PARAMS))
    assert (moe_row.moe, moe_row.active_params_b, moe_row.total_params_b) == (True, 0.2, 0.4)
    assert (moe_row.pf, moe_row.pf_total) == (400.0, 135.0)  # 54 tok/s per 0.4 B in all


def test_model_files_are_checked_by_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"model file {tmp_path / 'missing.gguf'} does not exist"):
        check_model_file(tmp_path / "missing.gguf", "cpu")
    text = tmp_path / "model.gguf"
    text.write_text("not a model")
    with pytest.raises(ValueError, match=f"model file {text} is not GGUF"):
        check_model_file(text, "cpu")
    with pytest.raises(ValueError, match=f"model path {tmp_path} is not a Hugging Face model folder"):
        check_model_file(tmp_path, "gpu")
    good = tmp_path / "good.gguf"
    good.write_bytes(b"GGUF" + bytes(16))
    check_model_file(good, "cpu")


def fake_engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    gguf = tmp_path / "shipped.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))
    monkeypatch.setattr(  # no engine is installed or built for a command line
        "lanes_pipeline.embedded.engines.cpu_server_binary",
        lambda engine, data: tmp_path / engine / "llama-server",
    )
    monkeypatch.setattr("lanes_pipeline.embedded.engines.embedded_gguf", lambda data: gguf)
    return gguf


def test_cpu_trial_command_carries_its_flags_and_extra_args(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gguf = fake_engines(monkeypatch, tmp_path)
    spec = TrialSpec(
        name="t",
        lane="cpu",
        model="smollm2-135m-instruct-q4_1",
        cpu={"threads": 1, "slots": 4, "ctx_size": 2048},
        extra_args=["-no-fmoe", "-ot", "exps=CPU"],
    )
    command, served = trials_module.server_command(spec, settings, 5555)
    argv = command.argv
    assert argv[argv.index("-m") + 1] == str(gguf)
    assert (argv[argv.index("-np") + 1], argv[argv.index("-t") + 1], argv[argv.index("-c") + 1]) == (
        "4",
        "1",
        "2048",
    )
    assert argv[-3:] == ["-no-fmoe", "-ot", "exps=CPU"] and "--metrics" in argv
    assert served == settings.lanes.cpu_lane.model_alias
    mainline = spec.model_copy(update={"cpu": spec.cpu.model_copy(update={"engine": "llama_cpp"})})
    assert trials_module.server_command(mainline, settings, 5555)[0].argv[0] == str(
        tmp_path / "llama_cpp" / "llama-server"
    )
    assert trials_module.engine_label(mainline, settings) == "llama_cpp"


@pytest.fixture
def private_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings whose data folder (trial logs) is the test's own."""
    monkeypatch.setenv("LANES_DATA_DIR", str(tmp_path / "data"))
    return load_settings()


def test_a_missing_model_file_is_a_recorded_failure_naming_its_path(
    private_settings: Settings, tmp_path: Path
) -> None:
    spec = TrialSpec(
        name="t", lane="cpu", model="smollm2-135m-instruct-q4_1", file=str(tmp_path / "nope.gguf")
    )
    result = trials_module.run_trial(spec, private_settings, SMALL, other="none")
    assert not result.ok and result.figures is None
    assert result.error == f"FileNotFoundError: model file {tmp_path / 'nope.gguf'} does not exist"


def test_a_server_that_fails_to_start_is_recorded_with_its_log_tail(
    private_settings: Settings, tmp_path: Path
) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))
    spec = TrialSpec(
        name="broken",
        lane="cpu",
        model="smollm2-135m-instruct-q4_1",
        file=str(gguf),
        command=["sh", "-c", "echo 'error: unknown argument: --bogus (port {port}, model {model})'; exit 3"],
    )
    result = trials_module.run_trial(spec, private_settings, SMALL, other="none")
    assert not result.ok
    assert result.error == "the embedded CPU lane server exited with code 3 while starting"
    assert "error: unknown argument: --bogus" in (result.log_tail or "")
    assert result.command.startswith("sh -c ") and str(gguf) in result.command


def test_quant_labels(settings: Settings) -> None:
    def spec(**values: object) -> TrialSpec:
        return TrialSpec(**{"name": "t", "lane": "cpu", "model": "smollm2-135m-instruct-q4_1", **values})

    assert trials_module.quant_label(spec(), settings) == "GGUF Q4_1"  # from models.yaml
    assert trials_module.quant_label(spec(file="made:Q8_0"), settings) == "Q8_0"
    assert trials_module.quant_label(spec(quant="IQ4_XS"), settings) == "IQ4_XS"
    lora = spec(lane="gpu", model="smollm2-135m-instruct-hf", gpu={"adapter": "random", "adapter_rank": 8})
    assert trials_module.quant_label(lora, settings) == "BF16 + LoRA r8"


def test_a_trial_s_parameters_come_from_its_gguf_else_from_models_yaml(
    settings: Settings, tmp_path: Path
) -> None:
    moe = tmp_path / "moe.gguf"
    write_gguf(moe, experts=4, used=2)
    spec = TrialSpec(name="t", lane="cpu", model="smollm2-135m-moe4-q4_0", file=str(moe))
    params = trials_module.model_params(spec, settings, moe)
    assert (params.moe, params.source) == (True, "gguf")
    assert params.active_params_b < params.total_params_b < 1e-5  # the file's own tensors, not the registry's
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(16))
    fallback = trials_module.model_params(spec.model_copy(update={"file": str(broken)}), settings, broken)
    assert (fallback.active_params_b, fallback.total_params_b) == (0.214, 0.373)
    assert fallback.source.startswith("models.yaml (") and "GGUF version 0" in fallback.source
    gpu = TrialSpec(name="g", lane="gpu", model="smollm2-135m-instruct-hf")
    assert trials_module.model_params(gpu, settings, tmp_path).source == "models.yaml"


def test_the_benchmark_says_what_each_figure_was_measured_on() -> None:
    line = trials_bench.workload_line("small", WORKLOADS["small"])
    assert line.startswith(
        "Workload `small` (`LANES_BENCH_TRIALS_WORKLOAD`): TTFT and TG from 1 streamed answer(s)"
    )
    assert "of 12 tokens, PP from 1 prompt(s) of 4 code blocks, TG@slots from 1 request(s) per slot" in line
    assert "of 32 tokens" in trials_bench.workload_line("default", WORKLOADS["default"])


def test_an_unknown_workload_is_refused_by_name_before_any_server_starts(
    private_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANES_BENCH_TRIALS_WORKLOAD", "huge")
    refused = "LANES_BENCH_TRIALS_WORKLOAD: unknown 'huge'; known: default, small"
    with pytest.raises(ValueError, match=refused):
        trials_bench.run(private_settings)
    assert not (private_settings.data_dir / "logs").exists()

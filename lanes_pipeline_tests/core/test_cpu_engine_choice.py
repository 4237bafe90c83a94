"""The embedded CPU lane's engine: ik_llama.cpp's llama-server (the default, built from a registry sdist) or
upstream llama.cpp's; the server command each gets, the config that selects it, and a failed ik build."""

from __future__ import annotations

import dataclasses
import stat
import tarfile
from pathlib import Path

import pytest

from lanes_pipeline.embedded import engines, ik_patches, moe_model
from lanes_pipeline.embedded.moe_upcycle import MoeSpec
from lanes_pipeline.embedded.servers import llama_server_command
from lanes_pipeline.embedded.source_patches import apply_source_patches
from lanes_pipeline.errors import EmbeddedStartError
from lanes_pipeline.settings import ConfigError, CpuLane, EmbeddedCpuServer, load_settings
from lanes_pipeline_tests.core.test_settings import _edit, _set
from lanes_pipeline_tests.core.test_settings import config_dir as config_dir

TEMPLATE = """int LLAMA_BUILD_NUMBER = @BUILD_NUMBER@;
char const *LLAMA_COMMIT = "@BUILD_COMMIT@";
char const *LLAMA_COMPILER = "@BUILD_COMPILER@";
char const *LLAMA_BUILD_TARGET = "@BUILD_TARGET@";
"""


def test_build_info_fills_every_placeholder_of_the_template() -> None:
    source = engines.build_info_source(TEMPLATE, 'cc (Debian "12") 12.2.0', "x86_64-linux-gnu")
    assert "@" not in source
    assert 'LLAMA_COMMIT = "ik-llama-cpp-python-0.1.5-sdist"' in source
    assert "LLAMA_COMPILER = \"cc (Debian '12') 12.2.0\"" in source  # a quote would end the C string
    assert "LLAMA_BUILD_NUMBER = 0;" in source and '"x86_64-linux-gnu"' in source


def test_ik_source_patches_apply_once_and_a_changed_source_is_named(tmp_path: Path) -> None:
    """Each fix goes in at every place it names, once (a resumed build finds it there); a tree with the
    expected text at fewer places (another sdist) stops the build naming the file. The failed-build test
    applies them to the real sdist."""
    paths = {
        "src/llama.cpp",
        "src/llama-grammar.cpp",
        "src/llama-build-context.cpp",
        "examples/server/server.cpp",
        "examples/server/server-context.cpp",
    }
    assert {p.path for p in ik_patches.IK_PATCHES} == paths
    log = tmp_path / "install.log"
    sources: dict[str, str] = {}
    for number, patch in enumerate(ik_patches.IK_PATCHES):
        handlers = [
            f"static int f{number}_{i}() {{\n    for (;;) {{\n{patch.old}\n    }}\n}}\n"
            for i in range(patch.occurrences)
        ]
        sources[patch.path] = sources.get(patch.path, "") + "".join(handlers)
    for path, text in sources.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    apply_source_patches(tmp_path, ik_patches.IK_PATCHES, log)
    for patch in ik_patches.IK_PATCHES:
        patched = (tmp_path / patch.path).read_text()
        assert patched.count(patch.new) == patch.occurrences and patch.old not in patched
    assert "break;" not in (tmp_path / "src/llama.cpp").read_text()
    server = (tmp_path / "examples/server/server.cpp").read_text()
    # every handler registers for its answer before it posts the task
    assert server.count("add_waiting_task_id(id_task);\n        ctx_server.queue_tasks.post") == 7
    # every failed slot action answers with the kind of result its handler waits for
    assert "send_error" not in (tmp_path / "examples/server/server-context.cpp").read_text()
    # an end of generation with the grammar unfinished ends the answer; nothing aborts the server
    assert "GGML_ABORT" not in (tmp_path / "src/llama-grammar.cpp").read_text()
    # a llama-architecture MoE layer adds its input, not the normalised input, as the residual
    graph = (tmp_path / "src/llama-build-context.cpp").read_text()
    assert "gf, true);" not in graph and "cur = ggml_add(ctx0, cur, ffn_inp);" in graph
    snapshot = {p.path: (tmp_path / p.path).read_text() for p in ik_patches.IK_PATCHES}
    apply_source_patches(tmp_path, ik_patches.IK_PATCHES, log)
    assert {p.path: (tmp_path / p.path).read_text() for p in ik_patches.IK_PATCHES} == snapshot
    server_patch = next(p for p in ik_patches.IK_PATCHES if p.path == "examples/server/server.cpp")
    (tmp_path / server_patch.path).write_text(server_patch.old * (server_patch.occurrences - 1))
    with pytest.raises(EmbeddedStartError, match=r"server\.cpp .*occurs 6 times, expected 7"):
        apply_source_patches(tmp_path, ik_patches.IK_PATCHES, log)
    (tmp_path / "src/llama.cpp").write_text("int other_version;\n")
    with pytest.raises(EmbeddedStartError, match=f"cannot apply the patch to {tmp_path / 'src/llama.cpp'}"):
        apply_source_patches(tmp_path, ik_patches.IK_PATCHES, log)
    assert '"patches"' in engines.IK_BUILD.stamp()  # a new patch rebuilds a cached server


@pytest.fixture
def fake_engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Path]:
    binaries = {"ik_llama": tmp_path / "ik" / "llama-server", "llama_cpp": tmp_path / "up" / "llama-server"}
    monkeypatch.setattr(engines, "cpu_server_binary", lambda engine, data: binaries[engine])
    monkeypatch.setattr(engines, "embedded_gguf", lambda data: tmp_path / "model.gguf")
    return binaries


def test_a_changed_patch_set_unpacks_the_sdist_afresh_and_a_resumed_build_keeps_its_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree patched by other patches (an earlier version of the project) lacks the text the new ones look
    for: it is unpacked again. The same build resumed keeps its tree (and its objects)."""
    monkeypatch.setenv("LANES_ENGINES_DIR", str(tmp_path / "engines"))
    # pip's download is skipped: the sdist is in place already
    monkeypatch.setattr(engines, "_run_logged", lambda *args, **kwargs: None)
    build = engines.IK_BUILD
    sdist = build.root() / "sdist"
    sdist.mkdir(parents=True)
    source = tmp_path / "pkg" / "ik_llama_cpp_python-0.1.5" / "vendor" / "ik_llama.cpp" / "src"
    source.mkdir(parents=True)
    (source / "llama-grammar.cpp").write_text("as shipped\n")
    with tarfile.open(sdist / "ik_llama_cpp_python-0.1.5.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "pkg" / "ik_llama_cpp_python-0.1.5", arcname="ik_llama_cpp_python-0.1.5")
    log = tmp_path / "install.log"
    with log.open("w") as handle:
        tree = engines._unpack_sdist(build, handle, log)
        (tree / "src" / "llama-grammar.cpp").write_text("patched\n")
        assert engines._unpack_sdist(build, handle, log) == tree
        assert (tree / "src" / "llama-grammar.cpp").read_text() == "patched\n"  # resumed: kept
        changed = dataclasses.replace(build, patches=build.patches[:-1])
        assert engines._unpack_sdist(changed, handle, log) == tree
        assert (tree / "src" / "llama-grammar.cpp").read_text() == "as shipped\n"  # other patches: afresh


def test_ik_gets_flash_attention_off_and_the_extra_args_after_the_lanes_own(
    fake_engines: dict[str, Path], tmp_path: Path
) -> None:
    moe = ["-rtr", "-ot", "exps=CPU", "-amb", "512", "-mla", "3", "-no-fmoe"]
    command = llama_server_command(CpuLane(embedded=EmbeddedCpuServer(extra_args=moe)), tmp_path, 9000)
    assert command.argv[0] == str(fake_engines["ik_llama"])
    assert command.argv[-len(moe) - 6 :] == ["-fa", "off", "-b", "32", "-ub", "32", *moe]
    assert command.env["LD_LIBRARY_PATH"].startswith(f"{fake_engines['ik_llama'].parent}:")
    batching = (["-b", "2048"], ["--batch-size=64"], ["-ub", "64"], ["--ubatch-size", "128"])
    for chosen in (["-fa", "on"], ["--flash-attn", "auto"], ["-no-fa"], *batching):
        argv = llama_server_command(CpuLane(embedded=EmbeddedCpuServer(extra_args=chosen)), tmp_path, 1).argv
        assert argv[-len(chosen) :] == chosen  # the user's choice stands alone
        sets_flash_attention = chosen not in batching
        ours = argv[: -len(chosen)]
        assert ("off" in ours) != sets_flash_attention and ("-ub" in ours) == sets_flash_attention
    upstream = CpuLane(embedded=EmbeddedCpuServer(engine="llama_cpp", extra_args=["--no-webui"]))
    argv = llama_server_command(upstream, tmp_path, 9000).argv
    assert argv[0] == str(fake_engines["llama_cpp"]) and "-fa" not in argv and argv[-1] == "--no-webui"


def test_both_engines_keep_slot_files_in_the_data_folder_unless_the_user_sets_the_path(
    fake_engines: dict[str, Path], tmp_path: Path
) -> None:
    """The batch copies a group's prefix between slots with slot files (cpu_lane/batching/slot_copy.py)."""
    for engine in ("ik_llama", "llama_cpp"):
        argv = llama_server_command(CpuLane(embedded=EmbeddedCpuServer(engine=engine)), tmp_path, 9003).argv
        path = argv[argv.index("--slot-save-path") + 1]
        assert path == f"{tmp_path}/run/cpu-lane-9003-slots/"  # ik joins it and the file name as given
        assert Path(path).is_dir()
    own = ["--slot-save-path", "/srv/slots/"]
    argv = llama_server_command(CpuLane(embedded=EmbeddedCpuServer(extra_args=own)), tmp_path, 9004).argv
    assert argv.count("--slot-save-path") == 1 and argv[-2:] == own


def test_both_engines_get_spare_http_handlers_unless_the_user_sets_them(
    fake_engines: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler per slot and 8 spare (ik never frees the handler of a failed slot restore), never fewer
    than the servers' own default of cores - 1."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    for engine in ("ik_llama", "llama_cpp"):
        lane = CpuLane(embedded=EmbeddedCpuServer(engine=engine, parallel=3))
        argv = llama_server_command(lane, tmp_path, 9005).argv
        assert argv[argv.index("--threads-http") + 1] == "11"
    monkeypatch.setattr("os.cpu_count", lambda: 32)
    argv = llama_server_command(CpuLane(), tmp_path, 9006).argv
    assert argv[argv.index("--threads-http") + 1] == "31"
    own = ["--threads-http", "4"]
    argv = llama_server_command(CpuLane(embedded=EmbeddedCpuServer(extra_args=own)), tmp_path, 9007).argv
    assert argv.count("--threads-http") == 1 and argv[-2:] == own


def test_the_api_key_reaches_ik_through_a_private_file_and_upstream_through_its_environment(
    fake_engines: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANES_TEST_ENGINE_KEY", "s3cret")
    ik = llama_server_command(CpuLane(api_key_env="LANES_TEST_ENGINE_KEY"), tmp_path, 9001)
    key_file = Path(ik.argv[ik.argv.index("--api-key-file") + 1])
    assert key_file.read_text() == "s3cret\n" and "s3cret" not in " ".join(ik.argv)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    lane = CpuLane(api_key_env="LANES_TEST_ENGINE_KEY", embedded=EmbeddedCpuServer(engine="llama_cpp"))
    upstream = llama_server_command(lane, tmp_path, 9002)
    assert upstream.env["LLAMA_API_KEY"] == "s3cret" and "--api-key-file" not in upstream.argv


def test_the_engine_and_extra_args_are_checked_in_the_config(config_dir: Path) -> None:
    assert load_settings(config_dir).lanes.cpu_lane.embedded.engine == "ik_llama"  # the shipped default
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "embedded", "engine", value="llama.cpp"))
    with pytest.raises(
        ConfigError, match=r"cpu_lane\.embedded\.engine: 'llama\.cpp' is not one of ik_llama or llama_cpp"
    ):
        load_settings(config_dir)
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "embedded", "engine", value="llama_cpp"))
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "embedded", "extra_args", value=["--port", "1"]))
    with pytest.raises(ConfigError, match=r"cpu_lane\.embedded\.extra_args: .*'--port' is set by the lane"):
        load_settings(config_dir)


def test_the_embedded_lane_serves_the_dense_or_the_upcycled_moe_model(
    fake_engines: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[MoeSpec] = []

    def upcycled(data: Path, spec: MoeSpec) -> Path:
        built.append(spec)
        return tmp_path / f"{spec.name}.gguf"

    monkeypatch.setattr(moe_model, "upcycled_moe_gguf", upcycled)
    for engine in ("ik_llama", "llama_cpp"):
        dense = llama_server_command(CpuLane(embedded=EmbeddedCpuServer(engine=engine)), tmp_path, 9008).argv
        assert dense[dense.index("-m") + 1] == str(tmp_path / "model.gguf")
        moe = EmbeddedCpuServer(engine=engine, model="moe", moe_experts=8)
        argv = llama_server_command(CpuLane(embedded=moe), tmp_path, 9009).argv
        assert argv[argv.index("-m") + 1] == str(tmp_path / "moe8.gguf")
    assert built == [MoeSpec(experts=8)] * 2


def test_the_embedded_model_must_be_the_kind_its_registry_entry_says(config_dir: Path) -> None:
    """PF divides by the registry entry's active parameters: a dense entry for the MoE would overstate it."""
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "embedded", value={"model": "moe"}))
    with pytest.raises(ConfigError) as caught:
        load_settings(config_dir)
    assert str(caught.value.issues[0]) == (
        "configs/lanes.yaml: cpu_lane.model: 'smollm2-135m-instruct-q4_1' is a dense model in "
        "configs/models.yaml, but cpu_lane.embedded.model serves the moe one: name a moe model of "
        "configs/models.yaml with path: embedded"
    )
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "model", value="smollm2-135m-moe4-q4_0"))
    assert load_settings(config_dir).lanes.cpu_lane.embedded.model == "moe"
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "embedded", value={"model": "moe", "moe_experts": 1}))
    with pytest.raises(ConfigError, match=r"cpu_lane\.embedded\.moe_experts: .*greater than or equal to 2"):
        load_settings(config_dir)
    _edit(config_dir, "lanes.yaml", _set("cpu_lane", "embedded", value={"model": "mixture"}))
    with pytest.raises(ConfigError, match=r"cpu_lane\.embedded\.model: 'mixture' is not one of dense or moe"):
        load_settings(config_dir)


def test_a_failed_ik_build_names_the_step_shows_the_log_tail_and_its_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LANES_ENGINES_DIR", str(tmp_path / "engines"))
    broken = engines.IkBuild(cmake_args=(*engines.IK_CMAKE_ARGS, "-DCMAKE_CXX_COMPILER=/nonexistent/c++"))
    with pytest.raises(EmbeddedStartError) as caught:
        engines.ensure_ik_server(tmp_path / "data", build=broken, echo=False)
    message, log_path = str(caught.value), tmp_path / "data" / "logs" / "install-ik-llama.log"
    assert "building ik_llama.cpp's llama-server failed at configure" in message
    assert f"full log: {log_path}" in message and "/nonexistent/c++" in caught.value.tail
    assert not (tmp_path / "engines" / "ik-llama" / ".lanes-installed").exists()  # no stamp: tried again

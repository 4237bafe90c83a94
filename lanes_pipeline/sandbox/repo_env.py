"""The repository's own test environment: a virtual environment with its declared dependencies and pytest.

A generated test of a repository that needs other packages cannot import them with the project's Python.
So the repository's dependency files are read (pyproject `[project].dependencies` and its test extras, PEP 735
`[dependency-groups]`, `requirements*.txt`, `setup.cfg`), and one environment is built per hash of what they
ask for (plus the interpreter's version), cached under `<data>/repo_envs/<hash>/`:

- `uv` when it is installed (fast), else `python -m venv` and pip; pytest is always installed;
- wheels only by default: building an sdist runs the package's own code on the host, outside the sandbox;
- a lock file per hash, so two processes never build the same environment; built in a temporary folder and
  renamed into place, so a half-built environment is never used (callers run `<env>/bin/python -m ...`:
  console scripts keep the temporary path in their shebang);
- a failed build is recorded (reason and log path) instead of raised, so the day goes on with analysis only,
  and is not retried for `retry_failed_after_s`.

Parsing is pure; `dependency_files_at` reads git objects; `ensure_env` builds.
"""

from __future__ import annotations

import configparser
import fcntl
import hashlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.git import ls_tree, read_blobs

ENV_FORMAT = 1  # bump when the way environments are built changes: every hash changes with it
TEST_GROUPS = frozenset({"test", "tests", "dev", "testing"})
_REQUIREMENTS = re.compile(r"^(?:[^/]*requirements[^/]*\.txt|requirements/[^/]+\.txt)$")


class DependencySpec(Frozen):
    requirements: list[str] = Field([], description="normalised, sorted, deduplicated")
    sources: list[str] = Field([], description="the dependency files read")
    skipped: list[str] = Field([], description="entries not installed, each with where and why")


class EnvResult(Frozen):
    ok: bool
    key: str
    path: str = Field(description="the environment's folder (present only when ok)")
    python: str = Field("", description="its interpreter, when ok")
    reason: str = ""
    log_path: str = ""
    builder: Literal["uv", "pip"] | None = None
    reused: bool = Field(False, description="found built (or failed) before, not built now")
    requirements: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------
# Reading dependency files (pure)
# ---------------------------------------------------------------------------------------------------------


def is_dependency_file(path: str) -> bool:
    """pyproject.toml, setup.cfg, and requirements files at the root (`requirements/*.txt` too); files
    about documentation are not: their packages are never needed by tests."""
    if path in {"pyproject.toml", "setup.cfg"}:
        return True
    return bool(_REQUIREMENTS.match(path)) and "doc" not in path.lower()


class _Reader:
    def __init__(self, files: Mapping[str, str]) -> None:
        self.files = files
        self.found: list[str] = []
        self.skipped: list[str] = []
        self.project = ""
        self.extras: dict[str, list[str]] = {}

    def add(self, where: str, text: str) -> None:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            first = str(exc).splitlines()[0] if str(exc) else "unreadable"
            self.skipped.append(f"{where}: {text!r} is not a requirement ({first})")
            return
        if requirement.url:
            self.skipped.append(f"{where}: {text!r} is a direct URL (only PyPI is used)")
            return
        if self.project and canonicalize_name(requirement.name) == self.project:
            for extra in sorted(requirement.extras):  # `pkg[test]` inside pkg: its own extras
                for item in self.extras.get(extra, []):
                    self.add(f"{where} ({requirement.name}[{extra}])", item)
            return
        self.found.append(str(requirement))

    def pyproject(self, text: str) -> None:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            self.skipped.append(f"pyproject.toml: not valid TOML ({exc})")
            return
        project = data.get("project", {})
        self.project = canonicalize_name(str(project.get("name", "")))
        self.extras = {str(k): list(v) for k, v in project.get("optional-dependencies", {}).items()}
        for item in project.get("dependencies", []):
            self.add("pyproject.toml [project].dependencies", str(item))
        for group in sorted(TEST_GROUPS & set(self.extras)):
            for item in self.extras[group]:
                self.add(f"pyproject.toml optional-dependencies.{group}", str(item))
        groups = data.get("dependency-groups", {})
        for group in sorted(TEST_GROUPS & set(groups)):
            for item in self._group(groups, group, []):
                self.add(f"pyproject.toml dependency-groups.{group}", item)

    def _group(self, groups: Mapping[str, object], name: str, seen: list[str]) -> list[str]:
        """A PEP 735 group's requirements with `{include-group = ...}` resolved (a cycle is reported)."""
        if name in seen:
            self.skipped.append(f"pyproject.toml dependency-groups: cycle {' -> '.join([*seen, name])}")
            return []
        items = groups.get(name, [])
        found: list[str] = []
        for item in items if isinstance(items, list) else []:
            if isinstance(item, str):
                found.append(item)
            elif isinstance(item, dict) and "include-group" in item:
                found += self._group(groups, str(item["include-group"]), [*seen, name])
        return found

    def setup_cfg(self, text: str) -> None:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error as exc:
            self.skipped.append(f"setup.cfg: not readable ({exc.__class__.__name__})")
            return
        for line in _cfg_lines(parser.get("options", "install_requires", fallback="")):
            self.add("setup.cfg install_requires", line)
        if parser.has_section("options.extras_require"):
            for group in sorted(TEST_GROUPS & set(parser.options("options.extras_require"))):
                for line in _cfg_lines(parser.get("options.extras_require", group)):
                    self.add(f"setup.cfg extras_require.{group}", line)

    def requirements(self, path: str, seen: Sequence[str] = ()) -> None:
        if path in seen:
            return
        for number, raw in enumerate(self.files.get(path, "").splitlines(), start=1):
            line = re.sub(r"(^|\s)#.*$", "", raw).strip()
            where = f"{path}:{number}"
            if not line:
                continue
            if line.startswith(("-r ", "--requirement ", "-r", "--requirement=")):
                name = re.sub(r"^(-r|--requirement)[ =]?", "", line).strip()
                included = posixpath.normpath(str(PurePosixPath(path).parent / name))
                if included in self.files:
                    self.requirements(included, [*seen, path])
                else:
                    self.skipped.append(f"{where}: {line!r} names a file not in the repository")
            elif line.startswith("-"):
                self.skipped.append(f"{where}: option {line.split()[0]!r} is not followed")
            elif line.startswith((".", "/")) or ("://" in line and "@" not in line):
                self.skipped.append(f"{where}: {line!r} is a path or URL (only PyPI is used)")
            else:
                self.add(where, line)


def _cfg_lines(value: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in value.splitlines() if line.split("#", 1)[0].strip()]


def read_dependencies(files: Mapping[str, str]) -> DependencySpec:
    """What the repository asks to have installed, from its dependency files (`path -> text`)."""
    reader = _Reader(files)
    used = sorted(p for p in files if is_dependency_file(p))
    if "pyproject.toml" in files:
        reader.pyproject(files["pyproject.toml"])
    if "setup.cfg" in files:
        reader.setup_cfg(files["setup.cfg"])
    for path in used:
        if path not in {"pyproject.toml", "setup.cfg"}:
            reader.requirements(path)
    return DependencySpec(requirements=sorted(set(reader.found)), sources=used, skipped=reader.skipped)


def dependency_files_at(repo: Path, commit: str) -> dict[str, str]:
    """The dependency files of a commit, from git objects (not the working tree)."""
    entries = [e for e in ls_tree(repo, commit) if is_dependency_file(e.path) and e.mode != "120000"]
    blobs = read_blobs(repo, [e.blob for e in entries])
    return {e.path: blobs[e.blob].decode("utf-8", errors="replace") for e in entries}


@lru_cache(maxsize=8)
def python_version(python: str) -> str:
    if python == sys.executable:
        return sys.version
    return subprocess.run(
        [python, "-c", "import sys; print(sys.version)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


def env_key(spec: DependencySpec, python: str, allow_sdist: bool) -> str:
    payload = json.dumps([ENV_FORMAT, spec.requirements, python_version(python), allow_sdist])
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


# ---------------------------------------------------------------------------------------------------------
# Building (I/O)
# ---------------------------------------------------------------------------------------------------------


def find_uv() -> str | None:
    """uv on PATH, or the binary of an installed `uv` package."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        import uv  # type: ignore[import-not-found]
    except ImportError:
        return None
    return str(uv.find_uv_bin())


def _commands(
    builder: str, uv: str | None, python: str, target: Path, reqs: Path, allow_sdist: bool
) -> list[tuple[str, list[str]]]:
    binary = [] if allow_sdist else ["--only-binary", ":all:"]
    env_python = str(target / "bin" / "python")
    if builder == "uv":
        assert uv is not None
        install = [uv, "pip", "install", "--python", env_python, *binary, "-r", str(reqs)]
        return [("venv", [uv, "venv", "--quiet", "--python", python, str(target)]), ("install", install)]
    # The host's pip installs into the new environment (`pip --python`): no ensurepip, seconds faster.
    return [
        ("venv", [python, "-m", "venv", "--without-pip", str(target)]),
        (
            "install",
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                env_python,
                "install",
                "--no-input",
                "--disable-pip-version-check",
                *binary,
                "-r",
                str(reqs),
            ],
        ),
    ]


def _run_logged(argv: Sequence[str], log: Path, timeout_s: float) -> str:
    """'' on success, else why not (with the log's last line)."""
    with log.open("a", encoding="utf-8") as handle:
        handle.write(f"$ {' '.join(argv)}\n")
        handle.flush()
        try:
            result = subprocess.run(
                argv, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout_s:.0f} s"
        except OSError as exc:
            return f"could not start: {exc}"
    if result.returncode == 0:
        return ""
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return f"exit {result.returncode}: {lines[-1][:300] if lines else ''}"


def ensure_env(
    spec: DependencySpec,
    data_dir: Path,
    python: str = sys.executable,
    timeout_s: float = 900.0,
    allow_sdist: bool = False,
    retry_failed_after_s: float = 86_400.0,
) -> EnvResult:
    """The environment for `spec`, built once per hash; never raises for a failed build."""
    key = env_key(spec, python, allow_sdist)
    root = data_dir / "repo_envs"
    root.mkdir(parents=True, exist_ok=True)
    final, failed, log = root / key, root / f"{key}.failed.json", root / f"{key}.log"
    common = {"key": key, "path": str(final), "log_path": str(log), "requirements": spec.requirements}
    with (root / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if (final / ".lanes-env.json").is_file():
            manifest = json.loads((final / ".lanes-env.json").read_text(encoding="utf-8"))
            return EnvResult(
                ok=True,
                python=str(final / "bin" / "python"),
                builder=manifest["builder"],
                reused=True,
                **common,
            )
        if failed.is_file() and time.time() - failed.stat().st_mtime < retry_failed_after_s:
            record = json.loads(failed.read_text(encoding="utf-8"))
            return EnvResult(
                ok=False, reason=record["reason"], builder=record["builder"], reused=True, **common
            )
        return _build(spec, python, final, failed, log, timeout_s, allow_sdist, common)


def _build(
    spec: DependencySpec,
    python: str,
    final: Path,
    failed: Path,
    log: Path,
    timeout_s: float,
    allow_sdist: bool,
    common: dict[str, object],
) -> EnvResult:
    uv = find_uv()
    builder: Literal["uv", "pip"] = "uv" if uv else "pip"
    building = final.with_name(f".build-{final.name}-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)  # only there without a manifest: a build that never finished
    log.write_text(f"building {final.name} with {builder}: {spec.requirements}\n", encoding="utf-8")
    building.mkdir()
    requirements = building / "lanes-requirements.txt"
    requirements.write_text("\n".join(["pytest", *spec.requirements]) + "\n", encoding="utf-8")
    reason = ""
    for step, argv in _commands(builder, uv, python, building, requirements, allow_sdist):
        problem = _run_logged(argv, log, timeout_s)
        if problem:
            reason = f"{step} failed: {problem}"
            break
    if not reason:
        manifest = {"builder": builder, "requirements": spec.requirements, "python": python_version(python)}
        (building / ".lanes-env.json").write_text(json.dumps(manifest), encoding="utf-8")
        building.rename(final)
        check = _run_logged([str(final / "bin" / "python"), "-c", "import pytest"], log, 120)
        if not check:
            failed.unlink(missing_ok=True)
            return EnvResult(ok=True, python=str(final / "bin" / "python"), builder=builder, **common)
        reason = f"the environment does not import pytest: {check}"
        shutil.rmtree(final, ignore_errors=True)
    shutil.rmtree(building, ignore_errors=True)
    failed.write_text(json.dumps({"reason": reason, "builder": builder}), encoding="utf-8")
    return EnvResult(ok=False, reason=reason, builder=builder, **common)

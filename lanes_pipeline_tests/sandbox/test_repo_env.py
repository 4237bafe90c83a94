"""The repository's own test environment: dependency files read, one environment per hash, built once under
a lock, failures recorded instead of raised. Builds use this machine's package index (PyPI only)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lanes_pipeline.cpu_lane.jobs.oracles import observe_calls
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.sandbox.repo_env import (
    DependencySpec,
    dependency_files_at,
    ensure_env,
    env_key,
    is_dependency_file,
    read_dependencies,
)
from lanes_pipeline.settings import SandboxLimits

PYPROJECT = """
[project]
name = "Demo_Pkg"
dependencies = ["six>=1.16", "attrs ; python_version >= '3.8'"]

[project.optional-dependencies]
test = ["pytest-timeout", "demo-pkg[fast]"]
fast = ["ujson"]
docs = ["sphinx"]

[dependency-groups]
dev = ["ruff", {include-group = "lint"}]
lint = ["flake8", {include-group = "dev"}]
"""
SETUP_CFG = """
[options]
install_requires =
    requests>=2  # comment
    idna
[options.extras_require]
testing = hypothesis
plot = matplotlib
"""
REQUIREMENTS = """# top
-r requirements/base.txt
-e .
--index-url https://mirror.invalid/simple
git+https://github.com/x/y.git
./local/pkg
pkg @ https://example.invalid/pkg.whl
not a requirement!!
toml==0.10.2  # pinned
"""


def test_dependency_files_and_what_they_ask_for() -> None:
    assert is_dependency_file("requirements-dev.txt") and is_dependency_file("requirements/base.txt")
    assert not is_dependency_file("requirements-docs.txt") and not is_dependency_file("sub/requirements.txt")
    files = {
        "pyproject.toml": PYPROJECT,
        "setup.cfg": SETUP_CFG,
        "requirements.txt": REQUIREMENTS,
        "requirements/base.txt": "pluggy\n-r ../requirements.txt\n",
        "README.md": "six",
    }
    spec = read_dependencies(files)
    assert spec.requirements == sorted(
        [
            "six>=1.16",
            'attrs; python_version >= "3.8"',
            "pytest-timeout",
            "ujson",
            "ruff",
            "flake8",
            "requests>=2",
            "idna",
            "hypothesis",
            "pluggy",
            "toml==0.10.2",
        ]
    )
    assert spec.sources == ["pyproject.toml", "requirements.txt", "requirements/base.txt", "setup.cfg"]
    skipped = "\n".join(spec.skipped)
    assert "dependency-groups: cycle dev -> lint -> dev" in skipped
    assert "requirements.txt:3: option '-e' is not followed" in skipped
    assert "requirements.txt:4: option '--index-url'" in skipped
    assert "requirements.txt:5: 'git+https://github.com/x/y.git' is a path or URL" in skipped
    assert "requirements.txt:6: './local/pkg' is a path or URL" in skipped
    assert "requirements.txt:7: 'pkg @ https://example.invalid/pkg.whl' is a direct URL" in skipped
    assert "requirements.txt:8: 'not a requirement!!' is not a requirement" in skipped
    assert (
        read_dependencies({"pyproject.toml": "[project\n"}).skipped[0].startswith("pyproject.toml: not valid")
    )
    assert read_dependencies({}) == DependencySpec()


def test_dependency_files_come_from_the_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    files = {"requirements.txt": "six\n", "mod.py": "x = 1\n"}
    commit = build_history(
        repo, [CommitSpec(when=datetime(2026, 11, 1, tzinfo=UTC), message="deps", files=files)]
    )
    (repo / "requirements.txt").write_text("uncommitted\n", encoding="utf-8")
    assert dependency_files_at(repo, commit) == {"requirements.txt": "six\n"}


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A data folder the sandbox's unprivileged uid can traverse (pytest's tmp_path sits below a 0700
    folder; making the environment visible from there is the sandbox's job, not tested here)."""
    with tempfile.TemporaryDirectory(prefix="lanes-repo-env-") as folder:
        Path(folder).chmod(0o755)
        yield Path(folder)


@pytest.mark.slow
def test_an_environment_is_built_once_per_hash_even_when_two_ask_at_once(open_folder: Path) -> None:
    tmp_path = open_folder
    spec = read_dependencies({"requirements.txt": "six\n"})
    results = []
    threads = [threading.Thread(target=lambda: results.append(ensure_env(spec, tmp_path))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r.ok for r in results), [r.reason for r in results]
    assert sorted(r.reused for r in results) == [False, True]
    env = results[0]
    assert Path(env.path) == tmp_path / "repo_envs" / env_key(spec, sys.executable, False)
    check = subprocess.run(
        [env.python, "-c", "import six, pytest, sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert check.stdout.strip() == env.path
    assert not list((tmp_path / "repo_envs").glob(".build-*"))  # the temporary folder was renamed
    again = ensure_env(spec, tmp_path)
    assert again.reused and again.python == env.python
    assert ensure_env(DependencySpec(), tmp_path).key != env.key
    # Inside the sandbox, code of the repository runs with this environment's interpreter and packages.
    module = "import sys\nimport six\n\n\ndef where(x):\n    return sys.prefix\n"
    commit = build_history(
        tmp_path / "repo",
        [CommitSpec(when=datetime(2026, 11, 1, tzinfo=UTC), message="m", files={"m.py": module})],
    )
    run = observe_calls(
        tmp_path / "repo",
        commit,
        "m",
        "where",
        ["where(1)"],
        SandboxLimits(timeout_s=20, memory_mb=768),
        python=env.python,
    )
    assert run.outcome == "ok" and run.observations[0].value_repr == repr(env.path)


@pytest.mark.slow
def test_a_failed_build_is_recorded_with_its_reason_and_not_retried_at_once(tmp_path: Path) -> None:
    spec = DependencySpec(requirements=["lanes-no-such-package-anywhere==0.0.1"])
    result = ensure_env(spec, tmp_path)
    assert not result.ok and result.reason.startswith("install failed: exit 1")
    assert "lanes-no-such-package-anywhere" in Path(result.log_path).read_text(encoding="utf-8")
    assert not Path(result.path).exists()
    again = ensure_env(spec, tmp_path)
    assert again.reused and again.reason == result.reason

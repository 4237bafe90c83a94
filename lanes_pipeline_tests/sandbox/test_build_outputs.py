"""What a repository's build writes that its git checkout lacks (issue 55): read from pyproject.toml, written
into the sandbox's export, so a package versioned by hatch-vcs imports there as it does once installed. The
real case is filelock 3.13.1 from PyPI, made into the git history its owner has: the sdist without the
version module hatch-vcs generates, tagged with its release."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lanes_pipeline.git import CommitSpec, build_history, git
from lanes_pipeline.sandbox.build_outputs import (
    FALLBACK_VERSION,
    build_outputs,
    version_from_describe,
    version_module,
    version_tuple,
    write_build_outputs,
)
from lanes_pipeline.sandbox.isolation import detect_isolation, export_commit, open_sandbox
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline_tests.cpu_lane.real_code import sdist_files

FILELOCK = sdist_files("filelock-3.13.1")
VERSION_FILE = "src/filelock/version.py"
IMPORT = (
    "import importlib.metadata, filelock; print(filelock.__version__, importlib.metadata.version('filelock'))"
)


def test_hatch_vcs_writes_its_version_file_and_the_metadata_of_an_installed_package() -> None:
    outputs = build_outputs(FILELOCK["pyproject.toml"], "3.13.1")
    assert outputs.plugin == "hatch-vcs" and outputs.notes == []
    assert sorted(outputs.files) == ["filelock-3.13.1.dist-info/METADATA", VERSION_FILE]
    namespace: dict[str, object] = {}
    exec(outputs.files[VERSION_FILE], namespace)  # the text build_outputs wrote, never the repository's
    assert (namespace["version"], namespace["__version_tuple__"]) == ("3.13.1", (3, 13, 1))
    assert "Name: filelock\nVersion: 3.13.1\n" in outputs.files["filelock-3.13.1.dist-info/METADATA"]


def test_setuptools_scm_with_its_template_and_what_is_refused() -> None:
    scm = '[project]\nname = "My-Pkg"\n[tool.setuptools_scm]\nwrite_to = "pkg/_v.py"\n'
    scm += "write_to_template = \"VERSION = '{version}'\\n\"\n"
    outputs = build_outputs(scm, "1.2.dev3")
    assert outputs.plugin == "setuptools-scm"
    assert outputs.files == {
        "pkg/_v.py": "VERSION = '1.2.dev3'\n",
        "my_pkg-1.2.dev3.dist-info/METADATA": "Metadata-Version: 2.1\nName: My-Pkg\nVersion: 1.2.dev3\n",
    }
    outside = build_outputs('[tool.setuptools_scm]\nversion_file = "../escape.py"\n', "1.0")
    assert outside.files == {} and "'../escape.py' is not a .py path in the repository" in outside.notes[0]
    broken = build_outputs("[project\nname=", "1.0")
    assert broken.files == {} and broken.notes[0].startswith("pyproject.toml does not parse")
    assert build_outputs('[project]\nname = "plain"\n', "1.0").plugin is None  # metadata only


def test_versions_as_the_plugins_read_them() -> None:
    assert version_from_describe("v3.13.1-0-gabc1234") == "3.13.1"
    assert version_from_describe("3.13.1-4-gabc1234") == "3.13.2.dev4"
    assert version_from_describe("release-candidate-2-gabc1234") == FALLBACK_VERSION
    assert version_tuple("1.2.dev3") == (1, 2, "dev3") and version_tuple("2.0") == (2, 0)
    assert version_module("1.0", "{broken") == version_module("1.0", None)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """filelock as its owner's git checkout has it: no generated version module, the release tagged."""
    repo = tmp_path_factory.mktemp("filelock") / "repo"
    files = {path: text for path, text in FILELOCK.items() if path not in (VERSION_FILE, "PKG-INFO")}
    commit = build_history(
        repo, [CommitSpec(when=datetime(2023, 11, 17, tzinfo=UTC), message="3.13.1", files=files)]
    )
    git(repo, "tag", "3.13.1", commit)
    return repo, commit


def test_the_checkout_does_not_import_without_its_build_step(
    checkout: tuple[Path, str], tmp_path: Path
) -> None:
    repo, commit = checkout
    export_commit(repo, commit, tmp_path / "export")
    plain = subprocess.run(
        [sys.executable, "-c", IMPORT], cwd=tmp_path / "export" / "src", capture_output=True, text=True
    )
    assert plain.returncode != 0 and "No module named 'filelock.version'" in plain.stderr


def test_the_sandbox_imports_the_checkout_as_if_it_were_installed(checkout: tuple[Path, str]) -> None:
    repo, commit = checkout
    with open_sandbox(
        repo, commit, SandboxLimits(timeout_s=30, memory_mb=768), detect_isolation()
    ) as sandbox:
        result = sandbox.run([sys.executable, "-c", IMPORT])
        assert result.returncode == 0, result.output
        assert result.output.strip().splitlines()[-1] == "3.13.1 3.13.1"


def test_a_version_file_behind_a_link_out_of_the_export_is_not_written(tmp_path: Path) -> None:
    """A hostile pyproject.toml names a version file inside a folder its tree links elsewhere."""
    outside, worktree = tmp_path / "outside", tmp_path / "export"
    outside.mkdir()
    worktree.mkdir()
    (worktree / "out").symlink_to(outside)
    (worktree / "pyproject.toml").write_text('[tool.setuptools_scm]\nversion_file = "out/deep/_v.py"\n')
    repo = tmp_path / "repo"
    build_history(repo, [CommitSpec(when=datetime(2026, 11, 1, tzinfo=UTC), message="x", files={"a.py": ""})])
    outputs = write_build_outputs(repo, git(repo, "rev-parse", "HEAD").decode().strip(), worktree)
    assert "out/deep/_v.py" in outputs.files  # read, and refused at the write
    assert list(outside.iterdir()) == [] and not (worktree / "out" / "deep").exists()

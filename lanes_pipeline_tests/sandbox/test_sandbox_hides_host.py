"""Hostile reads through the real sandbox (issue 14 item 5): a generated test that reaches for the host's
secrets - /root and the home folder, /home, /etc/shadow, the data folder around its sandbox, another
repository environment, pip's and the engines' caches, the project's checkout, another sandbox - or writes
into its worktree's parent gets nothing, while the sample repository's own tests still pass inside.

Each hostile test is first run on the host, outside any sandbox, where it passes: so its failing inside is
the sandbox's doing, not a broken test."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import lanes_pipeline
from lanes_pipeline.embedded.engines import engines_dir
from lanes_pipeline.git import build_history
from lanes_pipeline.repos import sample_repo
from lanes_pipeline.sandbox.isolation import (
    Isolation,
    detect_isolation,
    interpreter_folders,
    open_sandbox,
)
from lanes_pipeline.sandbox.outcomes import run_pytest_outcomes
from lanes_pipeline.settings import SandboxLimits

CHECKOUT = Path(lanes_pipeline.__file__).resolve().parent.parent
HOSTILE = "test_lanes_hostile.py"


@dataclass(frozen=True)
class Host:
    """What the hostile tests aim at: planted secrets (path -> content) and folders that exist on the host."""

    data: Path
    secrets: dict[str, str]
    env_a: Path  # the repository environment the sandbox runs with
    env_b: Path  # another repository's environment in the same data folder


def _plant(path: Path, secrets: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"secret-{uuid.uuid4().hex}"
    path.write_text(text, encoding="utf-8")
    secrets[str(path)] = text


def _fake_env(folder: Path) -> Path:
    """A repository environment as repo_env builds one (a venv of this Python), given pytest by a .pth
    pointing at the project's own packages, which the sandbox shows anyway."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    purelib = Path(sysconfig.get_paths(vars={"base": str(folder), "platbase": str(folder)})["purelib"])
    (purelib / "lanes_project.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def isolation() -> Isolation:
    return detect_isolation()


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    planted: list[Path] = []
    secrets: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="lanes-hostile-data-") as folder:
        data = Path(folder)
        data.chmod(0o755)  # traversable, as a real data folder is: hiding it is the sandbox's job
        token = uuid.uuid4().hex
        for path in (
            Path.home() / f".lanes-hostile-{token}",
            Path.home() / ".cache" / "pip" / f"lanes-hostile-{token}",
            engines_dir().parent / f"lanes-hostile-{token}",
        ):
            planted.append(path)
            _plant(path, secrets)
        env_a = _fake_env(data / "repo_envs" / "a")
        env_b = _fake_env(data / "repo_envs" / "b")
        _plant(data / "artifacts" / "lora_dataset" / "2026-11-01" / "rows.jsonl", secrets)
        _plant(env_b / "secret.txt", secrets)
        try:
            yield Host(data=data, secrets=secrets, env_a=env_a, env_b=env_b)
        finally:
            for path in planted:
                path.unlink(missing_ok=True)


def _listing(folder: str | Path) -> set[str]:
    """The host's entries of `folder` (empty where this user cannot list it)."""
    return set(os.listdir(folder)) if os.access(folder, os.R_OK | os.X_OK) else set()


def hostile_file(host: Host, other_sandbox: Path) -> str:
    """What a model might write to read the host. Every test passes on the host."""
    lines = ["import os", "from pathlib import Path", ""]
    sandboxes = other_sandbox.parent.parent
    for index, (path, text) in enumerate(sorted(host.secrets.items())):
        lines += [f"def test_planted_{index}():", f"    assert Path({path!r}).read_text() == {text!r}", ""]
    checks = {
        # Folders on the way to a visible one exist inside (holding only that way): compare whole listings.
        "root": f"{_listing('/root')} <= set(os.listdir('/root'))",
        "home_folder": f"{_listing(Path.home())} <= set(os.listdir({str(Path.home())!r}))",
        "home": f"os.path.isdir('/home') and {_listing('/home')} <= set(os.listdir('/home'))",
        "shadow": "Path('/etc/shadow').read_bytes() is not None",
        "shadow_masked": "os.stat('/etc/shadow').st_size > 0",  # not only unreadable: an empty stand-in
        "data_listing": f"'artifacts' in os.listdir({str(host.data)!r})",
        "other_sandbox_listed": f"{other_sandbox.parent.name!r} in os.listdir({str(sandboxes)!r})",
        "pip_cache": f"os.listdir({str(Path.home() / '.cache' / 'pip')!r})",
        "engines_cache": f"os.listdir({str(engines_dir().parent)!r})",
        "checkout": f"Path({str(CHECKOUT / 'pyproject.toml')!r}).read_text()",
        "checkout_source": f"Path({lanes_pipeline.__file__!r}).read_text() is not None",
        "other_sandbox": f"Path({str(other_sandbox / 'calc_secret.py')!r}).read_text() == 'other'",
        "write_parent": "Path('..', 'escaped.txt').write_text('x') == 1",
    }
    for name, expression in checks.items():
        lines += [f"def test_{name}():", f"    assert {expression}", ""]
    return "\n".join(lines)


CONTROL = """import os, sys
from pathlib import Path


def test_worktree_and_environment_are_readable():
    assert Path('textstats.py').read_text()
    assert Path(sys.prefix, 'pyvenv.cfg').is_file()
    Path('scratch.txt').write_text('ok')
"""


def _host_outcomes(code: str, tmp_path: Path) -> dict[str, str]:
    """The hostile tests run plainly on the host, in a worktree-like folder whose parent is scratch."""
    place = tmp_path / "host-run" / "wt"
    place.mkdir(parents=True)
    (place / HOSTILE).write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", HOSTILE],
        cwd=place,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    outcomes = {}
    for line in result.stdout.splitlines():
        word, _, node = line.partition(" ")
        if word in {"PASSED", "FAILED"}:
            outcomes[node.split(" ")[0].split("::")[-1]] = word.lower()
    return outcomes


def test_hostile_reads_get_nothing_and_the_repository_tests_still_pass(
    host: Host, isolation: Isolation, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    commit = build_history(repo, sample_repo.history())
    limits = SandboxLimits(timeout_s=60, memory_mb=1024, parent_dir=str(host.data / "sandboxes"))
    with open_sandbox(repo, commit, limits, isolation) as other:
        other.write("calc_secret.py", "other")
        code = hostile_file(host, other.worktree)
        names = sorted(line[4:].split("(")[0] for line in code.splitlines() if line.startswith("def test_"))
        assert len(names) == len(host.secrets) + 13
        expected_on_host = {n: "passed" for n in names}
        if not os.access("/etc/shadow", os.R_OK):  # rootless: the host's own user cannot read it either
            expected_on_host["test_shadow"] = "failed"
        if not os.access("/root", os.R_OK):
            expected_on_host["test_root"] = "failed"
        assert _host_outcomes(code, tmp_path) == expected_on_host

        for python in (None, str(host.env_a / "bin" / "python")):
            with open_sandbox(repo, commit, limits, isolation) as sandbox:
                assert host.data in sandbox.root.parents  # the sandbox sits inside the data folder
                sandbox.write(HOSTILE, code)
                sandbox.write("test_lanes_control.py", CONTROL)
                outcomes = run_pytest_outcomes(sandbox, [HOSTILE, "test_lanes_control.py", "tests"], python)
                hostile = {k.split("::")[-1]: v for k, v in outcomes.items() if k.startswith(HOSTILE)}
                assert hostile == {n: "failed" for n in names}, python
                assert not (sandbox.root / "escaped.txt").exists()
                rest = {k: v for k, v in outcomes.items() if not k.startswith(HOSTILE)}
                assert len(rest) > 10 and set(rest.values()) == {"passed"}, rest  # the sample's own tests
                assert (sandbox.worktree / "scratch.txt").read_text() == "ok"


def test_a_repository_environment_is_visible_and_nothing_beside_it(host: Host) -> None:
    """What the sandbox shows of an interpreter: its venv and the Python it was made from, no siblings."""
    shown = interpreter_folders(str(host.env_a / "bin" / "python"))
    assert str(host.env_a) in shown and os.path.realpath(sys.base_prefix) in shown
    assert not any(Path(p) == host.data or host.env_b == Path(p) for p in shown)
    assert interpreter_folders("python") == []  # a bare name found on PATH opens nothing

"""The anchor set (anchor_set.py): the vendored manifest is sound, each package becomes the same git
repository everywhere, the user's own repositories are never judged as anchors, and an anchor is rendered
and judged exactly as a held-out repository task (repo_tasks), in the real sandbox."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from lanes_pipeline.dataset.holdout_rules import HeldOutFunction
from lanes_pipeline.gpu_lane import anchor_set
from lanes_pipeline.gpu_lane.anchor_set import (
    MANIFEST_FILE,
    PACKAGES_DIR,
    AnchorSet,
    AnchorSetError,
    anchor_repos,
    anchor_task_name,
    load_anchor_set,
    load_manifest,
    normalised,
    reference_problem,
    sdist_bytes,
    sdist_files,
)
from lanes_pipeline.gpu_lane.humaneval import load_problems
from lanes_pipeline.gpu_lane.repo_tasks import body_task, judge_body, task_name
from lanes_pipeline.repos.snapshot import is_test_path
from lanes_pipeline.sandbox.isolation import detect_isolation
from lanes_pipeline.settings import SandboxLimits

LIMITS = SandboxLimits(runs=1, timeout_s=60)
NODE_ID = re.compile(r"^[\w/.-]+\.py(::[A-Za-z_]\w*){1,2}(\[[^\n]*\])?$")
MAX_PROMPT_CHARS = 12_000  # the longest today is 2,678 (more_itertools.replace): imports, callees, stub


def test_the_manifest_lists_enough_distinct_tasks_of_vendored_packages() -> None:
    manifest = load_manifest()
    names = [anchor_task_name(t.package, t.symbol) for t in manifest.tasks]
    assert len(names) >= 150 and len(set(names)) == len(names)
    assert names == sorted(names)  # a fixed order, whatever the builder's threads did
    assert {t.package for t in manifest.tasks} == {p.name for p in manifest.packages}
    for package in manifest.packages:
        sdist_bytes(package)  # byte-identical to what the builder read (sha256 checked)


def test_no_task_is_a_humaneval_problem() -> None:
    humaneval = {p.entry_point for p in load_problems()}
    names = {t.symbol.split("::", 1)[1] for t in load_manifest().tasks}
    assert not names & humaneval


def test_each_task_names_its_module_and_well_formed_tests_of_its_sdist() -> None:
    manifest = load_manifest()
    files = {p.name: sdist_files(p, sdist_bytes(p)) for p in manifest.packages}
    for task in manifest.tasks:
        assert task.symbol.startswith(f"{task.path}::") and task.path in files[task.package], task
        assert not is_test_path(task.path), task
        assert 1 <= len(task.tests) <= 20 and task.tests == sorted(set(task.tests)), task
        for node in task.tests:
            assert NODE_ID.match(node), node
            assert is_test_path(node.split("::", 1)[0]) and node.split("::", 1)[0] in files[task.package]


def test_names_are_compared_as_pypi_normalises_them() -> None:
    assert normalised("More_Itertools") == normalised("more.itertools") == "more-itertools"
    assert normalised("toolz") != normalised("cytoolz")


def test_a_package_named_like_a_users_repository_is_never_judged(tmp_path: Path) -> None:
    manifest = load_manifest()
    everything = ["More_Itertools", "TOOLZ", "boltons", "inflection"]
    assert {normalised(n) for n in everything} == {normalised(p.name) for p in manifest.packages}
    found = load_anchor_set(tmp_path, LIMITS, exclude=everything)  # nothing left to check: no sandbox
    assert found.functions == []
    assert sorted(found.not_tasks) == sorted(anchor_task_name(t.package, t.symbol) for t in manifest.tasks)
    assert all("excluded" in why for why in found.not_tasks.values())


def test_a_tampered_sdist_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "packages"
    shutil.copytree(PACKAGES_DIR, folder)
    sdist = folder / load_manifest().packages[0].sdist
    data = bytearray(sdist.read_bytes())
    data[-1] ^= 1
    sdist.write_bytes(bytes(data))
    with pytest.raises(AnchorSetError, match=re.escape(str(sdist))):
        anchor_repos(tmp_path / "data", folder)


def test_a_manifest_naming_an_unknown_package_is_refused_naming_the_file(tmp_path: Path) -> None:
    text = (PACKAGES_DIR / MANIFEST_FILE).read_text(encoding="utf-8")
    (tmp_path / MANIFEST_FILE).write_text(text.replace('"package": "toolz"', '"package": "toolz2"', 1))
    with pytest.raises(AnchorSetError, match=r"anchors\.json.*toolz2"):
        load_manifest(tmp_path)


def test_each_package_is_the_same_commit_everywhere_and_built_once(tmp_path: Path) -> None:
    first = anchor_repos(tmp_path / "a")
    started = time.monotonic()
    again = anchor_repos(tmp_path / "a")
    assert again == first and time.monotonic() - started < 2
    elsewhere = anchor_repos(tmp_path / "b")
    assert {k: c for k, (_, c) in elsewhere.items()} == {k: c for k, (_, c) in first.items()}


# ---------------------------------------------------------------------------------------------------------
# In the real sandbox
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anchor_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("anchor-data")


@pytest.fixture(scope="module")
def anchors(anchor_root: Path) -> AnchorSet:
    isolation = detect_isolation()
    started = time.monotonic()
    cold = load_anchor_set(anchor_root, LIMITS, isolation=isolation)
    cold_s = time.monotonic() - started
    started = time.monotonic()
    warm = load_anchor_set(anchor_root, LIMITS, isolation=isolation)
    print(f"\nload_anchor_set: cold {cold_s:.1f} s, warm {time.monotonic() - started:.1f} s")
    assert warm == cold
    print(f"not judged here: {cold.not_tasks}")
    return cold


def _sample(anchors: AnchorSet) -> list[HeldOutFunction]:
    """The first and the last anchor of each package (by name)."""
    by_repo: dict[str, list[HeldOutFunction]] = {}
    for function in anchors.functions:
        by_repo.setdefault(function.repo, []).append(function)
    return [f for group in by_repo.values() for f in (group[0], group[-1])]


def test_the_anchors_pass_their_own_tests_here(anchors: AnchorSet) -> None:
    assert len(anchors.functions) >= 150, anchors.not_tasks
    assert [task_name(f) for f in anchors.functions] == sorted(task_name(f) for f in anchors.functions)
    assert all(f.repo.startswith("anchor:") and f.repo_tests and not f.cpu_tests for f in anchors.functions)
    assert re.fullmatch(r"[0-9a-f]{16}", anchors.fingerprint)


def test_excluding_a_package_later_drops_its_tasks_without_a_new_check(
    anchors: AnchorSet, anchor_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_sandbox(*args: object, **kwargs: object) -> None:
        raise AssertionError("the reference check is cached: no sandbox is needed")

    monkeypatch.setattr(anchor_set, "open_sandbox", no_sandbox)
    fewer = load_anchor_set(anchor_root, LIMITS, exclude=["Inflection"])
    assert [f for f in anchors.functions if f.repo != "anchor:inflection"] == fewer.functions
    assert fewer.fingerprint != anchors.fingerprint
    assert any(name.startswith("anchor:inflection:") for name in fewer.not_tasks)


def test_an_anchor_is_asked_and_judged_as_a_repository_task(anchors: AnchorSet) -> None:
    sample = _sample(anchors)
    assert len(sample) == 8  # two of each package
    started = time.monotonic()
    for function in sample:
        task = body_task(function, "sys")
        assert function.stub in task.prompt and task.name == task_name(function)
        real = judge_body(function, f"```python\n{function.symbol.source}```", LIMITS)
        assert real.passed, (task.name, real.reason)
        name = function.symbol.name
        gutted = judge_body(
            function, f"```python\ndef {name}(*args, **kwargs):\n    raise NotImplementedError\n```", LIMITS
        )
        assert not gutted.passed, task.name
    print(f"\njudge_body: {(time.monotonic() - started) / (2 * len(sample)):.2f} s per answer")


def test_no_anchor_prompt_is_huge(anchors: AnchorSet) -> None:
    longest = max(anchors.functions, key=lambda f: len(body_task(f, "").prompt))
    chars = len(body_task(longest, "").prompt)
    print(f"\nlongest anchor prompt: {chars} characters ({task_name(longest)})")
    assert chars <= MAX_PROMPT_CHARS


def test_a_reference_failing_here_is_named_with_its_first_failing_test(anchors: AnchorSet) -> None:
    function = anchors.functions[0]
    passing = dict.fromkeys(function.repo_tests, "passed")
    assert reference_problem(function, passing) is None
    first = function.repo_tests[0]
    assert first in str(reference_problem(function, {**passing, first: "failed"}))
    assert "no report" in str(reference_problem(function, {}))

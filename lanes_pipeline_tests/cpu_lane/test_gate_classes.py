"""The review gate against its hostile corpus, class by class (issue 48; bench/gate_corpus*.py).

Whatever the review branch commits runs on the user's machine. For every class but `symlink`, each input
goes straight to `review.item_problem` with the file before and after (the writer's default check): no
harmful input may pass, and every control of the same shape must (a gate that refuses everything would
pass as safe). The `symlink` class runs for real: a sandboxed test leaves its report as a link to a host
canary, and the canary must not reach the RunReport the host reads. The whole corpus through git and the
sandbox is `python -m lanes_pipeline.bench gate`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lanes_pipeline.bench.gate import Canaries, symlink_run
from lanes_pipeline.bench.gate_corpus import CLASSES, GateClass, build_repo, corpus, of_class
from lanes_pipeline.cpu_lane.jobs.review import item_problem
from lanes_pipeline.sandbox.isolation import detect_isolation
from lanes_pipeline.settings import SandboxLimits

LIMITS = SandboxLimits(timeout_s=20, memory_mb=768, runs=1)


def test_the_corpus_has_300_inputs_and_every_class_both_kinds() -> None:
    entries = corpus()
    assert len(entries) >= 300
    for cls in CLASSES:
        mine = of_class(cls)
        assert any(e.harmful for e in mine) and any(not e.harmful for e in mine), cls
    assert all(e.before is not None for e in entries if e.kind in {"docstring", "refactor"})


def _verdicts(cls: GateClass) -> tuple[dict[str, str], dict[str, str]]:
    """(harmful inputs item_problem accepts: what they prove, controls it refuses: why)."""
    leaks, refused = {}, {}
    for entry in of_class(cls):
        problem = item_problem(entry.item(), entry.before, entry.after_text)
        if entry.harmful and problem is None:
            leaks[entry.name] = entry.proves
        elif not entry.harmful and problem is not None:
            refused[entry.name] = problem
    return leaks, refused


@pytest.mark.parametrize("cls", [c for c in CLASSES if c != "symlink"])
def test_no_harmful_input_of_the_class_passes_the_gate_and_every_control_does(cls: GateClass) -> None:
    leaks, refused = _verdicts(cls)
    assert leaks == {}, f"{len(leaks)} harmful {cls} input(s) accepted"
    assert refused == {}, f"{len(refused)} {cls} control(s) refused"


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Canaries]:
    folder = tmp_path_factory.mktemp("gate")
    host = folder / "host"
    host.mkdir()
    return folder / "sample", build_repo(folder / "sample"), Canaries(host)


@pytest.mark.parametrize("name", ["sym_report_abs", "sym_scratch_dir", "sym_plain_control"])
def test_a_report_left_as_a_link_does_not_bring_a_host_file_into_the_verdict(
    sample: tuple[Path, str, Canaries], name: str
) -> None:
    repo, base, canaries = sample
    (entry,) = [e for e in of_class("symlink") if e.name == name]
    accepted, what = symlink_run(repo, base, entry, canaries, LIMITS, detect_isolation())
    if entry.harmful:
        assert not accepted, f"the host read its canary: {what}"
    else:
        assert accepted, f"the control did not pass: {what}"

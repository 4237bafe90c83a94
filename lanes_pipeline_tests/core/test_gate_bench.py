"""`python -m lanes_pipeline.bench gate` on a slice of its corpus: every step runs (write_branch into a
real repository, the payload run at each accepted tip in the sandbox, a symlink run) and the figures have
the shape `results.gate` promises. Whether the gate leaks is test_gate_classes.py's question."""

from __future__ import annotations

from lanes_pipeline.bench.gate import run_corpus
from lanes_pipeline.bench.gate_corpus import CLASSES, corpus
from lanes_pipeline.settings import SandboxLimits

SLICE = ("rb_assign_eval", "rb_assign_control", "l_bytes_control", "sym_plain_control")
KEYS = {
    "tried",
    "harmful_accepted",
    "harmless_accepted",
    "harmless_total",
    "payload_ran",
    "by_class",
    "accepted_harmful",
    "refused_harmless",
    "markdown",
}


def test_the_bench_runs_a_slice_end_to_end() -> None:
    entries = [e for e in corpus() if e.name in SLICE]
    out = run_corpus(entries, SandboxLimits(timeout_s=20, memory_mb=768, runs=1))
    assert set(out) == KEYS
    assert out["tried"] == len(SLICE) and out["harmless_total"] == 3
    assert set(out["by_class"]) == set(CLASSES)
    assert out["by_class"]["rebinding"] == {
        "tried": 2,
        "harmful": 1,
        "harmful_accepted": out["harmful_accepted"],
        "harmless": 1,
        "harmless_accepted": 1 - ("rb_assign_control" in out["refused_harmless"]),
    }
    # A payload runs only where its input was accepted: the marker is looked for at an accepted tip.
    assert out["payload_ran"] <= out["harmful_accepted"]
    assert out["accepted_harmful"] == (["rb_assign_eval"] if out["harmful_accepted"] else [])

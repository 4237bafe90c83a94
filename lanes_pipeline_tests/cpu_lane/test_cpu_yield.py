"""The cpu_yield benchmark's report: every task kind present, unimplemented kinds marked, targets and gaps."""

from __future__ import annotations

from lanes_pipeline.bench.cpu_yield import KINDS, report, sample_days
from lanes_pipeline.cpu_lane.jobs.verified_sampling import KindYield, TargetTally, kind_yield


def test_the_report_has_every_kind_the_targets_and_the_gap() -> None:
    kinds = {
        "analysis": kind_yield([TargetTally(target="a", sampled=1, accepted=1)], note="not sampled"),
        "tests": kind_yield(
            [TargetTally(target="f", sampled=4, accepted=1), TargetTally(target="g", sampled=4, accepted=0)]
        ),
        "refactor": kind_yield([]),
        "docs": KindYield(note="not implemented"),
    }
    caught = {"analysis": 2, "tests": 3, "docs": 0}
    out = report(kinds, {"train": 30, "eval": 3}, [], [], sample_days(), caught)
    assert sample_days() == ["2026-11-01", "2026-11-02", "2026-11-03"]
    for name in KINDS:
        assert set(out[name]) >= {
            "asked",
            "sampled",
            "accepted",
            "targets_with_accepted",
            "pass_at_1",
            "pass_at_n",
        }
    assert out["docs"]["note"] == "not implemented" and out["docs"]["asked"] == 0
    assert (
        "note" not in out["tests"] and out["tests"]["pass_at_1"] == 0.125 and out["tests"]["pass_at_n"] == 0.5
    )
    assert out["dataset_rows"] == 33
    assert out["targets"]["dataset_rows"] == {"value": 33, "target": 40, "met": False, "gap": 7}
    assert out["targets"]["tests_targets_with_accepted_share"]["met"]
    assert (
        "MISSED by 7" in out["markdown"]
        and "| docs | 0 | 0 | 0 | 0 | 0 | 0.0% | 0.0% | not implemented |" in (out["markdown"])
    )
    # Beside `accepted`, per asset, what the reviewer's checks refused (refactor has none of its own).
    assert [out[name].get("reviewer_refusals_caught") for name in KINDS] == [2, 3, None, 0]
    assert "| refactor | 0 | 0 | 0 | no such check |" in out["markdown"]

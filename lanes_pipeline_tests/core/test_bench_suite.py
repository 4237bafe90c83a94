"""The suite benchmark's reading of pytest's JUnit report (a real one, from a scratch pytest session on two
xdist workers, as the benchmark runs the tiers) and its keys beside the targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanes_pipeline.bench.suite import FAST_TIER_TARGET_S, markdown, read_junit, summary

pytest_plugins = ["pytester"]


@pytest.fixture
def junit(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(
        test_sample="""
        import time
        import pytest

        def test_quick():
            pass

        def test_slowest():
            time.sleep(0.3)

        def test_broken():
            assert False

        @pytest.mark.skip(reason="not here")
        def test_skipped():
            pass

        class TestGroup:
            @pytest.mark.parametrize("n", [1])
            def test_in_class(self, n):
                pass
        """
    )
    report = pytester.path / "report.xml"
    pytester.runpytest_subprocess(f"--junitxml={report}", "-p", "no:cacheprovider", "-n", "2")
    return report


def test_counts_time_and_slowest_tests_come_from_the_report(junit: Path) -> None:
    run = read_junit(junit, "fast", exit_code=1, slowest=2)
    assert (run.tests, run.passed, run.failed, run.errors, run.skipped) == (5, 3, 1, 0, 1)
    assert run.test_s >= 0.3 and run.exit_code == 1 and run.selection == "not slow"
    assert [t.test for t in run.slowest][:1] == ["test_sample.py::test_slowest"]
    assert len(run.slowest) == 2
    every = {t.test: t.outcome for t in read_junit(junit, "slow", exit_code=1).slowest}
    assert every["test_sample.py::test_broken"] == "failed"
    assert run.failures == ["test_sample.py::test_broken"]
    assert every["test_sample.py::TestGroup::test_in_class[1]"] == "passed"


def test_keys_say_whether_the_targets_are_met_and_whether_all_passed(junit: Path) -> None:
    failing = read_junit(junit, "fast", exit_code=1)
    clean = failing.model_copy(update={"failed": 0, "exit_code": 0, "test_s": FAST_TIER_TARGET_S + 1})
    out = summary(600.0, clean, clean.model_copy(update={"tier": "slow", "selection": "slow"}))
    assert out["all_passed"] and not out["fast_tier_within_target"]
    assert out["cold_make_test_s"] == 600.0 + clean.test_s
    assert out["all_tiers_test_s"] == 2 * clean.test_s
    assert not summary(600.0, clean, failing)["all_passed"]
    assert '| fast | `-n 0 -m "not slow"` | 5 |' in markdown(out)
    two_workers = summary(600.0, clean.model_copy(update={"workers": 2}), clean)
    assert '| fast | `-n 2 -m "not slow"` | 5 |' in markdown(two_workers)
    assert "- Failed in the fast tier: `test_sample.py::test_broken`" in markdown(out)


def test_a_missing_report_names_the_tier_and_its_exit_code(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no JUnit report from the slow tier's pytest \\(exit 4\\)"):
        read_junit(tmp_path / "absent.xml", "slow", exit_code=4)

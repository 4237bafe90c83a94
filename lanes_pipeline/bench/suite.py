"""`python -m lanes_pipeline.bench suite`: how long the test suite takes on this machine, tier by tier.

The embedded engines are first installed into an empty engines folder (`LANES_ENGINES_DIR`), as on a cold
machine: `lanes setup --all-cpu-engines`, what `make test` runs before pytest (the `.venv` is this
checkout's and pip's download cache may be warm; `make .stamps/venv` is not timed here). Then the fast tier
(`pytest -m "not slow"`, `make test`) and the slow tier (`pytest -m slow`) run one after the other on those
engines, from this checkout, with `make test`'s xdist workers (TEST_WORKERS; by default two), each
writing a JUnit report that is read back for its counts, its test time (pytest's own session time, from
start to end) and its slowest tests. `make test-all` (CI's command) runs both tiers in one
session: its test time is about their sum, less one start of the session's servers.

Targets: the fast tier within 900 s of test time on 2 cores; a cold `make test` (installs included) within
35 minutes; `make test-all` within CI's 90 minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lanes_pipeline.bench.cpu_lane import _sigterm_unwinds
from lanes_pipeline.settings import Settings

Tier = Literal["fast", "slow"]
TIER_SELECTION: dict[Tier, str] = {"fast": "not slow", "slow": "slow"}
FAST_TIER_TARGET_S = 900.0
COLD_MAKE_TEST_TARGET_S = 35 * 60.0
CI_LIMIT_S = 90 * 60.0
SLOWEST = 15


class TestTime(BaseModel):
    model_config = ConfigDict(frozen=True)

    test: str  # pytest's node id, as `--durations` prints it
    seconds: float
    outcome: Literal["passed", "failed", "error", "skipped"]


class TierRun(BaseModel):
    """One tier's pytest session, read from its JUnit report."""

    model_config = ConfigDict(frozen=True)

    tier: Tier
    selection: str
    workers: int = 0  # pytest-xdist workers (0: one process)
    exit_code: int
    test_s: float  # pytest's session time (setup and teardown of every test included)
    tests: int
    passed: int
    failed: int
    errors: int
    skipped: int
    failures: list[str]  # node ids of the tests that failed or erred
    slowest: list[TestTime]


def _node_id(case: ElementTree.Element) -> str:
    """`path/to/test_file.py::test_name[param]` from JUnit's dotted classname and name."""
    classname, name = case.get("classname", ""), case.get("name", "")
    parts = classname.split(".")
    # The module is the dotted path's prefix up to the `test_*` module; what follows is a class.
    for end in range(len(parts), 0, -1):
        if parts[end - 1].startswith("test_"):
            return "::".join(["/".join(parts[:end]) + ".py", *parts[end:], name])
    return f"{classname}::{name}"


def _outcome(case: ElementTree.Element) -> Literal["passed", "failed", "error", "skipped"]:
    tags = {child.tag for child in case}
    if "failure" in tags:
        return "failed"
    if "error" in tags:
        return "error"
    if "skipped" in tags:
        return "skipped"
    return "passed"


def read_junit(path: Path, tier: Tier, exit_code: int, slowest: int = SLOWEST) -> TierRun:
    """The tier's figures from pytest's `--junitxml` report at `path`."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as exc:
        message = f"{path}: no JUnit report from the {tier} tier's pytest (exit {exit_code}): {exc}"
        raise ValueError(message) from exc
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(f"{path}: no <testsuite> element")
    times = [
        TestTime(test=_node_id(case), seconds=float(case.get("time", 0.0)), outcome=_outcome(case))
        for case in suite.iter("testcase")
    ]
    counts = {outcome: sum(t.outcome == outcome for t in times) for outcome in ("passed", "failed", "error")}
    return TierRun(
        tier=tier,
        selection=TIER_SELECTION[tier],
        exit_code=exit_code,
        test_s=round(float(suite.get("time", 0.0)), 1),
        tests=len(times),
        passed=counts["passed"],
        failed=counts["failed"],
        errors=counts["error"],
        skipped=sum(t.outcome == "skipped" for t in times),
        failures=[t.test for t in times if t.outcome in ("failed", "error")],
        slowest=sorted(times, key=lambda t: t.seconds, reverse=True)[:slowest],
    )


def summary(install_s: float, fast: TierRun, slow: TierRun) -> dict[str, Any]:
    """The benchmark's keys: the tiers' test times and counts beside their targets."""
    cold_make_test_s = round(install_s + fast.test_s, 1)
    all_tiers_test_s = round(fast.test_s + slow.test_s, 1)
    return {
        "cold_engine_install_s": round(install_s, 1),
        "fast_tier_test_s": fast.test_s,
        "fast_tier_tests": fast.tests,
        "fast_tier_target_s": FAST_TIER_TARGET_S,
        "fast_tier_within_target": fast.test_s <= FAST_TIER_TARGET_S,
        "slow_tier_test_s": slow.test_s,
        "slow_tier_tests": slow.tests,
        "all_tiers_test_s": all_tiers_test_s,
        "cold_make_test_s": cold_make_test_s,
        "cold_make_test_within_target": cold_make_test_s <= COLD_MAKE_TEST_TARGET_S,
        "cold_test_all_s": round(install_s + all_tiers_test_s, 1),
        "all_passed": all(run.exit_code == 0 and not run.failed and not run.errors for run in (fast, slow)),
        "tiers": [fast.model_dump(), slow.model_dump()],
    }


def markdown(out: dict[str, Any]) -> str:
    fast, slow = (TierRun.model_validate(tier) for tier in out["tiers"])
    lines = [
        "| tier | selection | tests | passed | failed | errors | skipped | test time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in (fast, slow):
        lines.append(
            f'| {run.tier} | `-n {run.workers} -m "{run.selection}"` | {run.tests} | {run.passed} | '
            f"{run.failed} | {run.errors} | {run.skipped} | {run.test_s:.0f} s |"
        )
    lines += [
        "",
        f"- Fast tier (`make test`): {out['fast_tier_test_s']:.0f} s of test time, target "
        f"{out['fast_tier_target_s']:.0f} s: {'met' if out['fast_tier_within_target'] else 'not met'}.",
        f"- Engines installed cold (`lanes setup --all-cpu-engines` into an empty engines folder): "
        f"{out['cold_engine_install_s']:.0f} s; a cold `make test` is then about "
        f"{out['cold_make_test_s']:.0f} s "
        f"(target {COLD_MAKE_TEST_TARGET_S:.0f} s) plus the `.venv`, a cold `make test-all` about "
        f"{out['cold_test_all_s']:.0f} s (CI's limit {CI_LIMIT_S:.0f} s).",
        *(f"- Failed in the {run.tier} tier: `{test}`" for run in (fast, slow) for test in run.failures),
        "",
        "Slowest tests, by tier (setup and teardown included):",
        "",
        "| tier | test | seconds | outcome |",
        "|---|---|---|---|",
    ]
    for run in (fast, slow):
        lines += [f"| {run.tier} | `{t.test}` | {t.seconds:.0f} | {t.outcome} |" for t in run.slowest[:8]]
    return "\n".join(lines)


def xdist_workers(root: Path, env: dict[str, str]) -> int:
    """The xdist workers `make test` uses here: TEST_WORKERS if set, else the suite's own default."""
    if env.get("TEST_WORKERS"):
        return int(env["TEST_WORKERS"])
    default = [sys.executable, "-m", "lanes_pipeline_tests.server_worker"]
    return int(subprocess.run(default, cwd=root, env=env, capture_output=True, text=True, check=True).stdout)


def run_tier(tier: Tier, root: Path, env: dict[str, str], report: Path) -> TierRun:
    workers = xdist_workers(root, env)
    selection = ["-n", str(workers), "-m", TIER_SELECTION[tier]]
    command = [sys.executable, "-m", "pytest", *selection, f"--junitxml={report}", "-q"]
    print(f"[bench] suite: {tier} tier: {' '.join(command[1:])}", flush=True)
    result = subprocess.run(command, cwd=root, env=env, check=False)
    return read_junit(report, tier, result.returncode).model_copy(update={"workers": workers})


def run(settings: Settings) -> dict[str, Any]:
    root = settings.project_root
    with tempfile.TemporaryDirectory(prefix="lanes-bench-suite-") as folder, _sigterm_unwinds():
        env = {**os.environ, "LANES_ENGINES_DIR": str(Path(folder) / "engines")}
        lanes = Path(sys.executable).parent / "lanes"
        started = time.perf_counter()
        print("[bench] suite: installing the engines into an empty folder", flush=True)
        subprocess.run([str(lanes), "setup", "--all-cpu-engines"], cwd=root, env=env, check=True)
        install_s = time.perf_counter() - started
        fast = run_tier("fast", root, env, Path(folder) / "fast.xml")
        slow = run_tier("slow", root, env, Path(folder) / "slow.xml")
    out = summary(install_s, fast, slow)
    # Which tests were timed (in the report only; documents name no commit): the tiers move as tests are
    # added, split or marked slow.
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    out["commit"] = head.stdout.strip() or None
    out["markdown"] = markdown(out)
    return out

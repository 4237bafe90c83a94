"""`gate`: the review gate against its hostile corpus (issue 48; the corpus is gate_corpus*.py).

Whatever the review branch commits, the user merges and runs outside any sandbox, so the bench runs each
input through the very functions the branch uses:

1. every review item through `review_branch.write_branch` (with its default check, `review.item_problem`)
   into a real repository (the sample's day 1 and the corpus's fixture modules), one branch per input,
   each on a day of its own, so that no input clashes with another: accepted = committed;
2. every accepted item's branch tip checked out in the sandbox (`open_sandbox`), where the whole
   repository is imported and its tests and doctests run (`pytest --doctest-modules .`: the changed module,
   a committed test file, the repository's own tests that call a refactored body); `payload_ran` counts the
   accepted harmful inputs whose payload ran there (the `PAYLOAD_RAN` marker appeared, or, for
   `literal_size`, the run died of memory or time);
3. the `symlink` inputs: a test run once through `open_sandbox` + `run_pytest` against a host canary:
   accepted = the canary reached the RunReport (its detail, or the host file's forged passes) or the run
   hung on the host past a timeout. This works against the host read as it was and as it is being fixed:
   only the RunReport is looked at.

`results.gate`: `tried`, `harmful_accepted`, `harmless_accepted`, `harmless_total`, `payload_ran`,
`by_class`, `accepted_harmful` (names) and `refused_harmless` (name: reason).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from lanes_pipeline.bench.gate_corpus import CLASSES, MARKER, GateInput, build_repo, corpus
from lanes_pipeline.bench.gate_corpus_symlink import TEST_PATH
from lanes_pipeline.cpu_lane.jobs.review_branch import identity, write_branch
from lanes_pipeline.sandbox.isolation import Isolation, RunReport, detect_isolation, open_sandbox, run_pytest
from lanes_pipeline.settings import SandboxLimits, Settings

FIRST_DAY = date(2027, 1, 1)
# A payload run's wall clock: the settings' limit, but no more than this (an endless literal would cost the
# full minute of every accepted literal_size input otherwise; a sample-repository run takes about 1 s).
PAYLOAD_TIMEOUT_S = 20.0
HOST_WAIT_S = 30.0  # past the sandbox's own timeout: the host itself is stuck reading
WORKERS = max(2, min(4, (os.cpu_count() or 2)))


class Outcome:
    """What became of one input."""

    def __init__(self, entry: GateInput, accepted: bool, reason: str) -> None:
        self.entry, self.accepted, self.reason = entry, accepted, reason
        self.tip: str | None = None
        self.payload_ran = False


def write_all(repo: Path, base: str, entries: Sequence[GateInput]) -> list[Outcome]:
    """Each input's item through write_branch on a day of its own; accepted = it became a commit."""
    outcomes = []
    for number, entry in enumerate(entries):
        day = (FIRST_DAY + timedelta(days=number)).isoformat()
        written = write_branch(repo, "sample", base, day, [entry.item()], identity(day, "UTC"))
        (row,) = written.rows
        outcome = Outcome(entry, row.status == "committed", row.reason)
        outcome.tip = written.tip
        outcomes.append(outcome)
    return outcomes


def payload_run(repo: Path, outcome: Outcome, limits: SandboxLimits, isolation: Isolation) -> bool:
    """Whether the accepted item's payload ran at its tip in the sandbox (see the module's notes)."""
    assert outcome.tip is not None
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--doctest-modules", "."]
    with open_sandbox(repo, outcome.tip, limits, isolation) as sandbox:
        result = sandbox.run(argv)
        marker = any(path.name == MARKER for path in sandbox.worktree.rglob("*"))
    if outcome.entry.payload == "resources":
        return result.timed_out or "MemoryError" in result.output
    return marker


# -- symlink ---------------------------------------------------------------------------------------------


def _canary_report(token: str, passes: int) -> str:
    tests = {f"{token}::forged_{n}": "passed" for n in range(passes)}
    errors = [{"nodeid": token, "type": token, "message": token}]
    return json.dumps({"tests": tests, "errors": errors, "collected": passes, "exitstatus": 0})


class Canaries:
    """Host files a sandboxed test may link its report to, all holding one token."""

    def __init__(self, folder: Path) -> None:
        self.token = f"LANES-GATE-CANARY-{uuid.uuid4().hex}"
        self.file = folder / "canary.json"
        self.file.write_text(_canary_report(self.token, 2))
        self.passes = folder / "pass.json"
        self.passes.write_text(json.dumps({"tests": {"a::b": "passed", "a::c": "passed"}, "errors": []}))
        self.dir = folder / "scratch"
        self.dir.mkdir()
        for index in range(4):
            (self.dir / f"report-{index}.json").write_text(_canary_report(self.token, 2))
        self.fifo = folder / "fifo"
        os.mkfifo(self.fifo)

    def fill(self, text: str) -> str:
        for key, value in {
            "{canary_file}": self.file,
            "{canary_dir}": self.dir,
            "{host_fifo}": self.fifo,
            "{canary_pass}": self.passes,
        }.items():
            text = text.replace(key, str(value))
        return text

    def leaked(self, run: RunReport) -> bool:
        """Whether the host read a canary into the verdict: the token, or the two passes only the host
        files hold (the test itself has one)."""
        return self.token in run.detail or run.passed == 2


def _unblock(folders: Sequence[Path]) -> None:
    """Open every FIFO under `folders` for writing and close it: a host blocked opening one for reading
    gets end-of-file, so its thread ends."""
    for folder in folders:
        for path in folder.rglob("*"):
            try:
                if stat.S_ISFIFO(path.lstat().st_mode):
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                continue


def symlink_run(
    repo: Path, base: str, entry: GateInput, canaries: Canaries, limits: SandboxLimits, isolation: Isolation
) -> tuple[bool, str]:
    """(accepted, what happened) of one symlink input: harmful ones are accepted when the canary reached
    the RunReport or the host hung; controls when their test passed."""
    box: dict[str, Any] = {}

    def target() -> None:
        with open_sandbox(repo, base, limits, isolation) as sandbox:
            box["root"] = sandbox.root
            sandbox.write(TEST_PATH, canaries.fill(entry.content or ""))
            box["run"] = run_pytest(sandbox, [TEST_PATH])

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limits.timeout_s + HOST_WAIT_S)
    if thread.is_alive():
        _unblock([p for p in (box.get("root"), canaries.fifo.parent) if p])
        thread.join(10)
        return entry.harmful, "the host hung reading what the sandbox left"
    run: RunReport | None = box.get("run")
    if run is None:
        return False, "the sandbox run raised"
    what = f"{run.outcome}: {run.detail}"[:200]
    if entry.harmful:
        return canaries.leaked(run), what
    return run.outcome == "passed" and not canaries.leaked(run), what


# -- the whole bench -------------------------------------------------------------------------------------


def classify(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    by_class: dict[str, dict[str, int]] = {}
    for cls in CLASSES:
        mine = [o for o in outcomes if o.entry.cls == cls]
        by_class[cls] = {
            "tried": len(mine),
            "harmful": sum(o.entry.harmful for o in mine),
            "harmful_accepted": sum(o.entry.harmful and o.accepted for o in mine),
            "harmless": sum(not o.entry.harmful for o in mine),
            "harmless_accepted": sum(not o.entry.harmful and o.accepted for o in mine),
        }
    harmless = [o for o in outcomes if not o.entry.harmful]
    return {
        "tried": len(outcomes),
        "harmful_accepted": sum(o.entry.harmful and o.accepted for o in outcomes),
        "harmless_accepted": sum(o.accepted for o in harmless),
        "harmless_total": len(harmless),
        "payload_ran": sum(o.entry.harmful and o.payload_ran for o in outcomes),
        "by_class": by_class,
        "accepted_harmful": sorted(o.entry.name for o in outcomes if o.entry.harmful and o.accepted),
        "refused_harmless": {o.entry.name: o.reason for o in harmless if not o.accepted},
    }


def markdown(out: dict[str, Any]) -> str:
    lines = [
        f"{out['tried']} inputs: {out['harmful_accepted']} harmful accepted, "
        f"{out['harmless_accepted']} of {out['harmless_total']} controls accepted, "
        f"{out['payload_ran']} payloads ran at an accepted tip.",
        "",
        "| class | tried | harmful | harmful accepted | harmless | harmless accepted |",
        "|---|---|---|---|---|---|",
    ]
    for cls, row in out["by_class"].items():
        lines.append(
            f"| {cls} | {row['tried']} | {row['harmful']} | {row['harmful_accepted']} | {row['harmless']} "
            f"| {row['harmless_accepted']} |"
        )
    return "\n".join(lines) + "\n"


def run_corpus(
    entries: Sequence[GateInput], limits: SandboxLimits, payloads: bool = True, log: bool = False
) -> dict[str, Any]:
    """The bench on `entries` (the whole corpus, or a slice of it); `payloads=False` skips step 2."""
    isolation = detect_isolation()
    limits = limits.model_copy(update={"timeout_s": min(limits.timeout_s, PAYLOAD_TIMEOUT_S)})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lanes-bench-gate-") as folder:
        repo = Path(folder) / "sample"
        base = build_repo(repo)
        written = [e for e in entries if e.kind != "sandbox"]
        outcomes = write_all(repo, base, written)
        git_s = time.perf_counter() - started
        if log:
            print(f"[bench] gate: {len(written)} items through write_branch in {git_s:.1f} s", flush=True)
        if payloads:
            accepted = [o for o in outcomes if o.accepted and o.tip]
            with ThreadPoolExecutor(WORKERS) as pool:
                ran = pool.map(lambda o: payload_run(repo, o, limits, isolation), accepted)
                for outcome, flag in zip(accepted, ran, strict=True):
                    outcome.payload_ran = flag
        canary_dir = Path(folder) / "host"
        canary_dir.mkdir()
        canaries = Canaries(canary_dir)
        for entry in (e for e in entries if e.kind == "sandbox"):
            accepted, what = symlink_run(repo, base, entry, canaries, limits, isolation)
            outcome = Outcome(entry, accepted, what)
            outcome.payload_ran = entry.harmful and accepted
            outcomes.append(outcome)
    out = classify(outcomes)
    if log:  # a payload that did not run at an accepted tip: the corpus, not the gate, may be wrong there
        silent = [
            o.entry.name
            for o in outcomes
            if o.entry.harmful and o.accepted and o.entry.payload != "none" and not o.payload_ran
        ]
        print(f"[bench] gate: accepted harmful inputs whose payload did not run: {silent}", flush=True)
    out["markdown"] = markdown(out)
    return out


def run(settings: Settings) -> dict[str, Any]:
    limits = settings.pipeline.cpu_assets.sandbox
    return run_corpus(corpus(), limits, log=True)

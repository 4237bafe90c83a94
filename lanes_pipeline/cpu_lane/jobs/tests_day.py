"""`generated_tests`' work on one repository for one day, symbol by symbol.

1. The day's symbols, as the `day_symbols` asset chose them (day_selection.py); the repository's register
   of covered symbols (memo keys asked, ids with an accepted test) grows as days run.
2. The repository's environment (repo_env): none needed without dependency files (the project's Python runs
   the tests); when one is needed and cannot be built, the reason is recorded and no test is asked that day.
3. The day's modules imported once in the sandbox (sandbox/import_check.py): a module that does not import
   is named with its cause, and its symbols are not asked (each would fail the same way).
4. Each symbol's oracle job (oracle_tests.py), remembered under what decides it (the symbol's memo key, the
   commit, the model, samples, tokens, sandbox limits): a re-run asks and judges nothing.

Coverage of the repository (symbols, covered so far, with an accepted test) comes back for the metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest, names_deterministic_failure
from lanes_pipeline.cpu_lane.jobs.backlog import is_covered
from lanes_pipeline.cpu_lane.jobs.day_selection import DAY_VERSION, DaySelection, register_of
from lanes_pipeline.cpu_lane.jobs.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.jobs.oracle_tests import (
    GATE_VERSION,
    SymbolTestResult,
    VerifyPlace,
    run_symbol_tests,
)
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.repos.symbols import Symbol
from lanes_pipeline.sandbox.import_check import ImportProblem, import_problems
from lanes_pipeline.sandbox.isolation import Isolation
from lanes_pipeline.sandbox.repo_env import dependency_files_at, ensure_env, read_dependencies
from lanes_pipeline.settings import SandboxLimits

# generated_tests' file of each repository's coverage after the day (`lanes status` reads the newest), in a
# store folder of its own: coverage depends on the days run before, the day's partition must not.
COVERAGE_FOLDER = "test_coverage"
COVERAGE_FILE = "coverage.json"
# Verdicts reached without a sandbox: nothing to run, or rejected on its text alone.
NO_SANDBOX = frozenset({"no_answer", "no_calls", "rejected_static"})


class SymbolTestCoverage(Frozen):
    """One repository's coverage by generated tests, after the day."""

    repo: str
    symbols: int
    covered: int = Field(description="symbols asked for tests in their current form, on any day so far")
    with_accepted_test: int
    changed_today: int
    backlog_today: int
    remaining: int = Field(description="never-covered symbols still waiting after the day")
    left_out: dict[str, str] = Field({}, description="files not scanned, with the reason")
    environment: str = Field("", description="why no test ran (the environment could not be built)")
    import_problems: dict[str, str] = Field(
        {}, description="module -> why it does not import in the sandbox (its symbols were not asked)"
    )

    def share(self) -> float:
        return round(self.with_accepted_test / self.symbols, 4) if self.symbols else 0.0


class SymbolTestsConfig(Frozen):
    model: str
    samples: int
    limits: SandboxLimits
    max_tokens: int | None = None


Send = Callable[[Sequence[BatchRequest]], BatchResult]


class SymbolTestDay:
    """The memo namespaces of the job, a sender for batches, and the batches it sent (for the metadata)."""

    def __init__(self, results: Memo, register: Memo, config: SymbolTestsConfig, data_dir: Path) -> None:
        self.results, self.register, self.config, self.data_dir = results, register, config, data_dir
        self.batches: list[BatchResult] = []
        self.asked = 0
        self.failed = 0  # requests that failed (transiently or not): for the lane's failure gate
        self.verified = 0  # answers this run took into a sandbox (remembered results need none)

    def run(
        self,
        snapshot: Snapshot,
        repo: Path,
        selection: DaySelection | None,
        send: Send,
        isolation: Callable[[], Isolation],
    ) -> tuple[list[SymbolTestResult], SymbolTestCoverage | None]:
        """`selection`: the day's symbols (day_symbols); None for a repository without a commit yet."""
        if snapshot.commit is None or selection is None:
            return [], None
        today, chosen, targets = selection.today, selection.chosen, selection.targets()
        register_key, covered, accepted = register_of(self.register, snapshot.repo)
        python, reason = self._environment(repo, snapshot.commit)
        results: list[SymbolTestResult] = []
        problems: dict[str, ImportProblem] = {}
        if not reason:
            place = VerifyPlace(
                repo=repo,
                commit=snapshot.commit,
                limits=self.config.limits,
                python=python,
                isolation=isolation() if targets else None,
            )
            modules = sorted({s.module for s in targets})
            problems = import_problems(
                repo, snapshot.commit, modules, self.config.limits, place.isolation, python
            )
            runnable = [s for s in targets if s.module not in problems]
            results = self._results(place, runnable, snapshot.repo_map, today.test_sources, send)
            covered |= {s.memo_key for s in runnable}  # a module that does not import: asked again
            accepted |= {r.symbol_id for r in results if r.accepted_tests}
            self.register.put(register_key, {"covered": sorted(covered), "accepted": sorted(accepted)})
        coverage = SymbolTestCoverage(
            repo=snapshot.repo,
            symbols=len(today.symbols),
            covered=sum(is_covered(s, covered) for s in today.symbols),
            with_accepted_test=sum(s.id in accepted for s in today.symbols),
            changed_today=len(chosen.changed),
            backlog_today=len(chosen.backlog),
            remaining=chosen.remaining,
            left_out=today.left_out,
            environment=reason,
            import_problems={module: problem.describe() for module, problem in problems.items()},
        )
        return results, coverage

    def _environment(self, repo: Path, commit: str) -> tuple[str | None, str]:
        """(the interpreter tests run with, '' or why none could be built)."""
        files = dependency_files_at(repo, commit)
        if not files:
            return None, ""  # nothing to install: the project's own Python (it has pytest) runs them
        env = ensure_env(read_dependencies(files), self.data_dir)
        if not env.ok:
            return None, f"the repository's environment could not be built: {env.reason} (log {env.log_path})"
        return env.python, ""

    def _key(self, symbol: Symbol, place: VerifyPlace) -> str:
        config = self.config
        asked = (config.model, config.samples, config.max_tokens, config.limits.model_dump())
        return memo_key(
            "symbol_tests",
            DAY_VERSION,
            GATE_VERSION,
            symbol.memo_key,
            place.commit,
            *asked,
            place.python is not None,
        )

    def _results(
        self,
        place: VerifyPlace,
        targets: Sequence[Symbol],
        repo_map: str,
        test_sources: Mapping[str, str],
        send: Send,
    ) -> list[SymbolTestResult]:
        keys = {s.id: self._key(s, place) for s in targets}
        known = {i: self.results.get(k) for i, k in keys.items()}
        missing = [s for s in targets if known[s.id] is None]
        if missing:
            found, batch = run_symbol_tests(
                send,
                place,
                missing,
                repo_map,
                test_sources,
                self.config.samples,
                max_tokens=self.config.max_tokens,
            )
            if batch is not None:
                self.batches.append(batch)
                self.asked += len(batch.results)
                self.failed += batch.summary.failed
            self.verified += sum(a.status not in NO_SANDBOX for r in found for a in r.answers)
            for result in found:
                # A transient failure of some answers is not remembered: the next run asks that symbol again.
                if not any(
                    a.status == "no_answer" and not names_deterministic_failure(a.reason)
                    for a in result.answers
                ):
                    self.results.put(keys[result.symbol_id], result.model_dump(mode="json"))
                known[result.symbol_id] = result.model_dump(mode="json")
        return [SymbolTestResult.model_validate(known[s.id]) for s in targets]

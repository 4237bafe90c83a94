"""What repo_analysis and refactor_proposals share now that they work symbol by symbol: asking the lane about
the day's symbols through the memo, and the registers that say how much of a repository is covered.

`SymbolQuestions` looks each symbol's answer up in the memo by its key (made of the symbol's memo key, so
source plus context: editing one function of a big module re-asks only that function) and asks only the
missing ones, in one batch per repository with the repo map as the shared prompt prefix. It takes a
`send` function (the lane's run_batch in the assets, canned answers in tests) and counts what it asked and
what failed transiently, for the lane's failure gate.

Coverage registers, one per repository and job, remember the memo keys of symbols with an accepted
analysis or an accepted refactor proposal on any day; generated_tests keeps its own (tests_day.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lanes_pipeline.cpu_lane.assets.common import LaneUsage, is_transient
from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest, ItemResult
from lanes_pipeline.cpu_lane.jobs.backlog import RepoCoverage, coverage
from lanes_pipeline.cpu_lane.jobs.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.jobs.prompts import PromptLayout, TaskKind
from lanes_pipeline.cpu_lane.jobs.tasks import symbol_prompt
from lanes_pipeline.cpu_lane.jobs.tests_day import register_of
from lanes_pipeline.cpu_lane.resources import fail_on_transient_failures
from lanes_pipeline.daily.artifacts import md_table
from lanes_pipeline.repos.symbols import Symbol

Send = Callable[[Sequence[BatchRequest]], BatchResult]
REGISTER_VERSION = 1  # bump to forget what the registers remember
COVERAGE = "coverage"  # the memo namespace of the registers


class SymbolQuestions:
    """One asset's questions about symbols: answers remembered in `memo`, batches counted."""

    def __init__(self, asset: str, memo: Memo) -> None:
        self.asset, self.memo = asset, memo
        self.usage = LaneUsage()
        self.asked = 0
        self.failures: list[ItemResult] = []  # the transient ones: asked again next run

    def answers(
        self,
        repo: str,
        repo_map: str,
        symbols: Sequence[Symbol],
        keys: Mapping[str, str],
        task: TaskKind,
        max_tokens: int,
        shape: Callable[[ItemResult], Any],
        send: Send,
    ) -> dict[str, Any]:
        """symbol id -> remembered value, or `shape(item)` of a fresh answer (remembered unless it failed
        transiently or shaped to None: then the next run asks again)."""
        known = {s.id: self.memo.get(keys[s.id]) for s in symbols}
        missing = [s for s in symbols if known[s.id] is None]
        if not missing:
            return known
        layout = PromptLayout(task, shared_context=repo_map)
        requests = [layout.build(f"{repo}:{s.id}", symbol_prompt(s), max_tokens=max_tokens) for s in missing]
        result = send(requests)
        self.usage.add(result)
        self.asked += len(requests)
        for symbol, item in zip(missing, result.results, strict=True):
            value = shape(item)
            if value is None or is_transient(item):
                self.failures.append(item)
            else:
                self.memo.put(keys[symbol.id], value)
            known[symbol.id] = value
        return known

    def check_failures(self, max_failure_ratio: float) -> None:
        """The lane's failure gate: fail the asset when too many requests failed transiently; what was
        answered stays remembered. The failures, each with its reason, go with it."""
        fail_on_transient_failures(self.asset, self.failures, self.asked, max_failure_ratio, self.metadata())

    def metadata(self) -> dict[str, Any]:
        return {"asked_this_run": self.asked, **self.usage.metadata(self.memo.hits)}


class CoverageRegister:
    """Memo keys of a repository's symbols that got an accepted result of one job, on any day."""

    def __init__(self, memo: Memo, job: str) -> None:
        self.memo, self.job = memo, job

    def _key(self, repo: str) -> str:
        return memo_key(f"{self.job}_register", REGISTER_VERSION, repo)

    def accepted(self, repo: str) -> set[str]:
        return set(self.memo.get(self._key(repo)) or [])

    def add(self, repo: str, keys: set[str]) -> None:
        known = self.accepted(repo)
        if not keys <= known:
            self.memo.put(self._key(repo), sorted(known | keys))


def repo_coverage(
    repo: str, symbols: Sequence[Symbol], analysed: set[str], tests_register: Memo, proposed: set[str]
) -> RepoCoverage:
    """A repository's coverage by the three jobs: accepted analyses and proposals (memo keys, from their
    registers) and accepted generated tests (symbol ids, from generated_tests' register)."""
    _, _, tested = register_of(tests_register, repo)
    return coverage(repo, symbols, analysed, tested, proposed)


def coverage_table(rows: Sequence[RepoCoverage]) -> Any:
    return md_table(
        ["repo", "symbols", "analysed", "with accepted test", "with accepted proposal"],
        [
            (
                c.repo,
                c.symbols,
                f"{c.analysed} ({c.share('analysed'):.0%})",
                f"{c.with_accepted_test} ({c.share('with_accepted_test'):.0%})",
                f"{c.with_accepted_proposal} ({c.share('with_accepted_proposal'):.0%})",
            )
            for c in rows
        ],
    )

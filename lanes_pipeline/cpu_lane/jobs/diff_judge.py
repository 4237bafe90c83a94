"""Judging the refactors the CPU lane proposed into the rows refactor_proposals writes.

`DiffJudge` parses each answer, confines a symbol's diff to its lines (symbol_diff), then runs `git apply
--check` and the tests in the sandbox (diff_check.check_diff). Every verdict is remembered under a key made
of what decided it (the diff, the commit, the sandbox limits and the accepted tests it ran with), so a re-run
judges nothing; the sandbox's isolation is detected once, on first use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.jobs.diff_check import baseline_passes, check_diff
from lanes_pipeline.cpu_lane.jobs.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.jobs.rows import (
    DiffCheckRecord,
    GeneratedTestRow,
    RefactorRow,
    RememberedAnswer,
)
from lanes_pipeline.cpu_lane.jobs.symbol_diff import apply_confined, confine_to_symbol
from lanes_pipeline.cpu_lane.jobs.tasks import TASKS_VERSION, parse_diff
from lanes_pipeline.repos.symbols import Symbol
from lanes_pipeline.sandbox.isolation import Isolation, detect_isolation
from lanes_pipeline.sandbox.safety import unsafe_code_added
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline.store import canonical_json, sha256_bytes

NO_ANSWER = "the CPU lane did not answer"


class DiffScope(Frozen):
    """Where a symbol's refactor may change its file: the symbol, and the file's text at the commit."""

    symbol: Symbol
    file_source: str


class DiffJudge:
    """Refactor diffs -> rows, each judged with its repository's accepted generated tests of the day;
    verdicts remembered in `memo`, sandboxes with `limits`."""

    def __init__(self, memo: Memo, limits: SandboxLimits) -> None:
        self.memo, self.limits = memo, limits
        self._isolation: Isolation | None = None

    def isolation(self) -> Isolation:
        if self._isolation is None:
            self._isolation = detect_isolation()
        return self._isolation

    def rows(
        self,
        repo: str,
        repo_path: Path,
        commit: str,
        tests: Sequence[GeneratedTestRow],
        answers: Mapping[str, RememberedAnswer | None],
        scopes: Mapping[str, DiffScope] | None = None,
    ) -> list[RefactorRow]:
        """One row per answer, in order: keyed by a file's path, or by a symbol's id when `scopes` holds
        that symbol (then its diff must stay inside the symbol's lines: confine_to_symbol). The repository's
        own tests run once without any diff first (only if some diff needs the sandbox): when they fail, no
        diff is judged."""
        scopes = scopes or {}
        accepted_tests = {
            t.test_file: t.code for t in tests if t.repo == repo and t.accepted and t.code is not None
        }
        tests_hash = sha256_bytes(canonical_json(accepted_tests))
        baseline: str | None = None  # why the tests fail without a diff ('' when they pass), once asked
        rows = []
        for key_of_answer, answer in answers.items():
            scope = scopes.get(key_of_answer)
            path = scope.symbol.path if scope else key_of_answer
            base = {"repo": repo, "path": path, **({"symbol": scope.symbol.name} if scope else {})}
            if answer is None or answer.answer is None:
                reason = answer.why_not() if answer else NO_ANSWER
                rows.append(RefactorRow(**base, diff=None, verdict="no_answer", reason=reason))
                continue
            parsed = parse_diff(answer.answer, path)
            if scope is not None and not isinstance(parsed, tuple):
                parsed = confine_to_symbol(parsed, scope.file_source, scope.symbol)
            if scope is not None and not isinstance(parsed, tuple):
                added = unsafe_code_added(scope.file_source, apply_confined(parsed, scope.file_source))
                if added:
                    parsed = (
                        "unsafe_code",
                        f"the diff adds what the sandbox policy forbids: {', '.join(added)}",
                    )
            if isinstance(parsed, tuple):
                rows.append(RefactorRow(**base, diff=None, verdict=parsed[0], reason=parsed[1]))
                continue
            key = memo_key(
                "diff_check",
                TASKS_VERSION,
                sha256_bytes(parsed.text.encode()),
                commit,
                tests_hash,
                self.limits.model_dump(),
            )
            remembered = self.memo.get(key)
            if remembered is not None:
                check = DiffCheckRecord.model_validate(remembered)
            else:
                if baseline is None:
                    baseline = baseline_passes(repo_path, commit, self.limits, self.isolation())
                if baseline:
                    check = DiffCheckRecord(
                        verdict="baseline_failing", reason=f"tests fail without the diff: {baseline}"
                    )
                else:
                    judged = check_diff(
                        repo_path, commit, parsed, accepted_tests, self.limits, self.isolation()
                    )
                    check = DiffCheckRecord(verdict=judged.verdict, reason=judged.reason[:600])
                self.memo.put(key, check.model_dump())
            rows.append(RefactorRow(**base, diff=parsed.text, **check.model_dump()))
        return rows

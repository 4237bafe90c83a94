"""Judging what the CPU lane answered, file by file or symbol by symbol, into the rows the assets write.

`GeneratedTestJudge` turns remembered answers into generated-test rows (static checks, then repeated
sandbox runs: verification.judge_generated_test); `DiffJudge` refactor answers into refactor rows (parse,
confine a symbol's diff to its lines: symbol_diff, then `git apply --check` and the tests in the sandbox:
verification.check_diff). Every verdict is remembered under a key made of what decided it (code or diff,
commit, sandbox limits, and for a diff the accepted tests it ran with), so a re-run judges nothing; the
sandbox's isolation is detected once, on first use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from lanes_pipeline.cpu_lane.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.rows import (
    DiffCheckRecord,
    GeneratedTestRow,
    RefactorRow,
    RememberedAnswer,
    TestVerdictRecord,
)
from lanes_pipeline.cpu_lane.symbol_diff import apply_confined, confine_to_symbol
from lanes_pipeline.cpu_lane.tasks import TASKS_VERSION, extract_block, parse_diff, test_module_name
from lanes_pipeline.cpu_lane.verification import baseline_passes, check_diff, judge_generated_test
from lanes_pipeline.repos.snapshot import module_name
from lanes_pipeline.repos.symbols import Symbol
from lanes_pipeline.sandbox.isolation import Isolation, detect_isolation
from lanes_pipeline.sandbox.safety import unsafe_code_added
from lanes_pipeline.settings import SandboxLimits
from lanes_pipeline.store import canonical_json, sha256_bytes

NO_ANSWER = "the CPU lane did not answer"


class DiffScope(BaseModel):
    """Where a symbol's refactor may change its file: the symbol, and the file's text at the commit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    symbol: Symbol
    file_source: str


class _Judge:
    """Verdicts remembered in `memo`, sandboxes with `limits`, the host's isolation detected once."""

    def __init__(self, memo: Memo, limits: SandboxLimits) -> None:
        self.memo, self.limits = memo, limits
        self._isolation: Isolation | None = None

    def isolation(self) -> Isolation:
        if self._isolation is None:
            self._isolation = detect_isolation()
        return self._isolation


class GeneratedTestJudge(_Judge):
    """Generated test modules -> rows; counts the sandbox runs this materialization made."""

    def __init__(self, memo: Memo, limits: SandboxLimits) -> None:
        super().__init__(memo, limits)
        self.sandbox_runs = 0

    def rows(
        self, repo: str, repo_path: Path, commit: str, answers: Mapping[str, RememberedAnswer | None]
    ) -> list[GeneratedTestRow]:
        """One row per file (path -> its remembered answer, None when the lane gave none), in order."""
        return [self.row(repo, repo_path, commit, path, answer) for path, answer in answers.items()]

    def row(
        self, repo: str, repo_path: Path, commit: str, path: str, answer: RememberedAnswer | None
    ) -> GeneratedTestRow:
        module = module_name(path)
        base = {"repo": repo, "path": path, "module": module, "test_file": test_module_name(path)}
        if answer is None or answer.answer is None:
            reason = answer.why_not() if answer else NO_ANSWER
            return GeneratedTestRow(**base, code=None, verdict="no_answer", reason=reason)
        code = extract_block(answer.answer, ("python", "py")).strip() + "\n"
        key = memo_key(
            "test_verdict", TASKS_VERSION, sha256_bytes(code.encode()), commit, self.limits.model_dump()
        )
        remembered = self.memo.get(key)
        if remembered is not None:
            verdict = TestVerdictRecord.model_validate(remembered)
        else:
            judged = judge_generated_test(
                repo_path, commit, path, module, code, self.limits, self.isolation()
            )
            self.sandbox_runs += len(judged.runs)
            verdict = TestVerdictRecord(
                verdict=judged.verdict, reason=judged.reason[:600], runs=[r.outcome for r in judged.runs]
            )
            self.memo.put(key, verdict.model_dump())
        return GeneratedTestRow(**base, code=code, **verdict.model_dump())


class DiffJudge(_Judge):
    """Refactor diffs -> rows, each judged with its repository's accepted generated tests of the day."""

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

"""What the CPU-lane assets write, declared once: the rows of each asset's `results.json`, the values they
remember, and the figures of their metadata that `lanes run`'s summary reads.

The asset that writes a row builds it from these models; an asset that reads it validates it with the same
model (`read_rows`), so a renamed or missing field fails where it is read, naming the file. The JSON keeps
the shape it always had: an optional field that is not set is left out (`exclude_if`), not written as null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from lanes_pipeline.cpu_lane.jobs.diff_check import DiffVerdict
from lanes_pipeline.cpu_lane.jobs.docstrings import DocStatus
from lanes_pipeline.cpu_lane.jobs.oracle_tests import SymbolRejection
from lanes_pipeline.cpu_lane.jobs.tasks import DiffRejection, FileAnalysis
from lanes_pipeline.daily.artifacts import Figures
from lanes_pipeline.sandbox.isolation import Outcome, Verdict


def _unset(value: object) -> bool:
    return value is None


def _empty(value: list[str]) -> bool:
    return not value


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


RowT = TypeVar("RowT", bound=Row)


def read_rows(model: type[RowT], data: Any, where: str) -> list[RowT]:
    """A `results.json` list as rows; a row that does not fit says which file and why."""
    try:
        return TypeAdapter(list[model]).validate_python(data)  # type: ignore[valid-type]
    except ValidationError as exc:
        raise ValueError(f"{where}: not a list of {model.__name__} rows: {exc}") from None


# --- answers the lane gave, as remembered (memo values) ---------------------------------------------------


class RememberedAnswer(Row):
    """A free-text answer (a test module, a diff), or the deterministic failure that stands for one."""

    answer: str | None
    reason: str | None = Field(None, exclude_if=_unset)

    @classmethod
    def read(cls, value: Any) -> RememberedAnswer | None:
        """A remembered value as an answer; None (nothing remembered: a transient failure) stays None."""
        return None if value is None else cls.model_validate(value)

    def why_not(self) -> str:
        return self.reason or "the CPU lane did not answer"


# --- repo_analysis ----------------------------------------------------------------------------------------

AnalysisStatus = Literal["ok", "unparseable", "too_long", "empty", "failed"]


class AnalysisAnswer(Row):
    """A file's analysis as remembered: the validated analysis, or why there is none."""

    status: AnalysisStatus
    analysis: FileAnalysis | None = Field(None, exclude_if=_unset)
    reason: str | None = Field(None, exclude_if=_unset)


class FileAnalysisRow(AnalysisAnswer):
    """One item of `repo_analysis/<day>/results.json`: a symbol (`symbol` set: its qualified name in the
    file at `path`, whose blob is `blob`) or, in rows written before analysis went by symbol, a whole file;
    `accepted` only where the analysis is ok."""

    path: str
    blob: str
    accepted: bool | None = Field(None, exclude_if=_unset)
    symbol: str | None = Field(None, exclude_if=_unset)


class AnalysisRow(Row):
    """One repository of `repo_analysis/<day>/results.json`."""

    repo: str
    commit: str | None
    files: list[FileAnalysisRow]


# --- generated_tests --------------------------------------------------------------------------------------

# A symbol's row (generated_tests works symbol by symbol) says why none of its answers was accepted.
TestRowVerdict = Verdict | Literal["no_answer"] | SymbolRejection


class TestVerdictRecord(Row):
    """The sandbox's verdict on one generated test module, as remembered."""

    verdict: Verdict
    reason: str
    runs: list[Outcome]


class GeneratedTestRow(Row):
    """One row of `generated_tests/<day>/results.json`: `code` is None when the lane gave no module. A row
    of a symbol (`symbol` set) holds its best accepted test, and how many of its sampled answers passed."""

    repo: str
    path: str
    module: str
    test_file: str
    code: str | None
    verdict: TestRowVerdict
    reason: str
    runs: list[Outcome] | None = Field(None, exclude_if=_unset)
    symbol: str | None = Field(None, exclude_if=_unset)
    sampled: int | None = Field(None, exclude_if=_unset)
    accepted_answers: int | None = Field(None, exclude_if=_unset)
    reviewer_refusals: int | None = Field(
        None, exclude_if=_unset, description="sampled answers a reviewer's check refused (AnswerVerdict)"
    )

    @property
    def accepted(self) -> bool:
        return self.verdict == "passed"


# --- generated_docs ---------------------------------------------------------------------------------------


class GeneratedDocRow(Row):
    """One symbol of `generated_docs/<day>/results.json`: its longest accepted docstring (with the symbol
    as documented and the diff of its file), or the rejection that got furthest, with its reason."""

    repo: str
    path: str
    module: str
    symbol: str
    verdict: DocStatus
    reason: str
    sampled: int
    accepted_answers: int
    docstring: str | None = Field(None, exclude_if=_unset)
    documented: str | None = Field(None, exclude_if=_unset, description="the symbol's source, documented")
    diff: str | None = Field(None, exclude_if=_unset, description="unified diff of the file (git apply)")
    # Left out when empty, so an older day's results.json (written before the checks were listed) still
    # reads and a row that passed none keeps its old shape.
    checks: list[str] = Field(
        [], exclude_if=_empty, description="the checks its docstring passed (docstring_day.DOC_CHECKS)"
    )
    reviewer_refusals: int | None = Field(
        None, exclude_if=_unset, description="sampled answers refused for what they state (REVIEWER_REFUSALS)"
    )

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"


# --- refactor_proposals -----------------------------------------------------------------------------------

RefactorVerdict = DiffVerdict | DiffRejection | Literal["no_answer"]


class DiffCheckRecord(Row):
    """The sandbox's verdict on one proposed diff, as remembered."""

    verdict: DiffVerdict
    reason: str


class RefactorRow(Row):
    """One row of `refactor_proposals/<day>/results.json`: `diff` is None when no diff could be judged;
    `symbol` names the symbol of `path` the diff is confined to (unset in rows of whole files)."""

    repo: str
    path: str
    diff: str | None
    verdict: RefactorVerdict
    reason: str
    symbol: str | None = Field(None, exclude_if=_unset)

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"


# --- review_branch ----------------------------------------------------------------------------------------

ReviewKind = Literal["test", "docstring", "refactor"]


class ReviewItemRow(Row):
    """One item of `review_branch/<day>/results.json`: an accepted result of the day and what became of it
    on the review branch (`commit` when it is one, else the reason it was left off)."""

    repo: str
    kind: ReviewKind
    path: str = Field(description="the file the item changes (a test: the test file it adds)")
    symbol: str
    status: Literal["committed", "skipped"]
    reason: str
    commit: str | None = Field(None, exclude_if=_unset)
    # Left out when empty, so an older day's results.json (written before checks were listed) still reads.
    checks: list[str] = Field([], exclude_if=_empty, description="what the gate checked the item for")


class ReviewRepoRow(Row):
    """One repository of `review_branch/<day>/branches.json`: its review branch (None: none was written,
    `note` says why), the snapshot commit it starts from, and how its tests went at the tip."""

    repo: str
    location: str
    branch: str | None
    base: str | None
    tip: str | None
    commits: int
    skipped: int
    tests_at_tip: str = Field(description="outcome of the repository's tests at the tip, in the sandbox")
    review_command: str | None
    note: str = ""


# --- figures: the metadata names each asset writes and the run summary reads ------------------------------


class LaneUsageFigures(Figures):
    """What a CPU-lane asset asked the lane (SymbolQuestions): `llm_requests` is the count the summary's
    "0 LLM calls" proof adds up."""

    llm_requests: int = 0
    llm_answered: int = 0
    cache_hits: int = 0
    memo_hits: int = 0
    response_cache_hits: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_tokens_per_s: float = 0.0
    prompt_tokens_per_s: float = 0.0
    prefix_reuse: float = 0.0
    # The layout's limit: the share of prompt tokens a perfect prefix cache could have served (each prompt's
    # longest common prefix with one evaluated before it in its batch), and how much of it the server reached.
    cacheable_prompt_tokens: int = 0
    prefix_reuse_limit: float = 0.0
    prefix_reuse_of_limit: float = 0.0
    llm_wall_s: float = 0.0

    @staticmethod
    def recorded_in(metadata: Mapping[str, Any]) -> bool:
        """Whether a materialization's metadata holds lane usage (a CPU-lane asset's)."""
        return "llm_requests" in metadata


class SnapshotFigures(Figures):
    repos: int = 0
    files: int = 0
    changed_files: int = 0
    deleted_files: int = 0
    left_out_files: int = 0


class AnalysisFigures(Figures):
    """Items are the day's symbols (analysed today or remembered); coverage counts a repository's symbols
    with an accepted analysis of their current form, from any day."""

    items: int = 0
    files: int = 0  # the files those symbols are in
    analysed_ok: int = 0
    unparseable: int = 0
    unparseable_ratio: float = 0.0
    too_long: int = 0
    failed_transient: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0
    symbols: int = 0
    symbols_analysed: int = 0
    analysis_coverage: float = 0.0


class GeneratedTestsFigures(Figures):
    candidates: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0
    sandbox_runs: int = 0
    verdict_memo_hits: int = 0
    # coverage of the day's repositories: symbols with an accepted test, all days so far
    symbols: int = 0
    symbols_with_accepted_test: int = 0
    test_coverage: float = 0.0
    # why a day may be empty: modules that do not import in the sandbox, and the first one's cause
    modules_not_importable: int = 0
    import_problem: str = ""


class GeneratedDocsFigures(Figures):
    candidates: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0
    sandbox_runs: int = 0
    verdict_memo_hits: int = 0
    # coverage of the day's repositories: symbols with an accepted docstring, all days so far
    symbols: int = 0
    symbols_with_accepted_docs: int = 0
    docs_coverage: float = 0.0


class ReviewFigures(Figures):
    """review_branch: commits written on the day's branches, items left off, branches whose tests passed
    at the tip."""

    repos: int = 0
    branches: int = 0
    commits: int = 0
    items_skipped: int = 0  # not `skipped`: the run summary reads that key as the symbols a day went without
    tips_passing: int = 0


class RefactorFigures(Figures):
    proposals: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0
    check_memo_hits: int = 0
    # coverage of the day's repositories: symbols with an accepted proposal for their current form
    symbols: int = 0
    symbols_with_accepted_proposal: int = 0
    proposal_coverage: float = 0.0


def tests_by_symbol(rows: list[GeneratedTestRow]) -> dict[str, dict[str, list[str]]]:
    """repo -> symbol name -> the day's accepted test modules for it. Pure."""
    found: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        if row.accepted and row.code is not None and row.symbol is not None:
            found.setdefault(row.repo, {}).setdefault(row.symbol, []).append(row.code)
    return found

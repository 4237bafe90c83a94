"""repo_analysis and refactor_proposals symbol by symbol, with canned answers (no model): a module larger than
max_file_bytes is kept by the snapshot and analysed symbol by symbol (only an unparseable file is left
out, with its reason); editing one function of it re-asks only that function; the prompt shows the
symbol with its context; an analysis may name only what the symbol defines; a symbol's refactor diff
must stay inside its lines. Real-server runs: test_cpu_assets.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from lanes_pipeline.cpu_lane.assets.by_symbol import COVERAGE, CoverageRegister, SymbolQuestions
from lanes_pipeline.cpu_lane.assets.refactor_proposals import RefactorDay
from lanes_pipeline.cpu_lane.assets.repo_analysis import AnalysisDay, symbol_row
from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest, ItemResult
from lanes_pipeline.cpu_lane.batching.batch_summary import summarize
from lanes_pipeline.cpu_lane.jobs.day_selection import DaySelection, select_day
from lanes_pipeline.cpu_lane.jobs.diff_judge import DiffJudge
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.cpu_lane.jobs.rows import AnalysisAnswer
from lanes_pipeline.cpu_lane.jobs.tasks import FileAnalysis, symbol_defines, symbol_prompt
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.repos.snapshot import SelectionRules, Snapshot, take_snapshot
from lanes_pipeline.repos.symbols import extract_symbols
from lanes_pipeline.settings import CpuAssetsConfig, SandboxLimits
from lanes_pipeline.store import ArtifactStore

FUNCTIONS = 40
MAX_FILE_BYTES = CpuAssetsConfig().max_file_bytes


def function(i: int, body: str = "") -> str:
    doc = " ".join(["Scale the value by a fixed factor and clamp it into the allowed range."] * 4)
    return (
        f"def scale_{i}(value: float, limit: float = 100.0) -> float:\n"
        f'    """{doc}"""\n'
        f"    scaled = value * {i + 1}{body}\n"
        f"    if scaled > limit:\n"
        f"        return limit\n"
        f"    return max(scaled, -limit)\n"
    )


def module(edited: int | None = None) -> str:
    parts = [function(i, " + 0.5" if i == edited else "") for i in range(FUNCTIONS)]
    return '"""Many scaling helpers."""\n\nimport math\n\n\n' + "\n\n".join(parts)


TESTS = "from pkg.scaling import scale_0\n\n\ndef test_scale_0():\n    assert scale_0(2.0) == 2.0\n"


def analysis_of(name: str) -> str:
    return json.dumps(
        {
            "summary": f"Scales a value in {name}.",
            "public_api": [name],
            "risks": [],
            "test_ideas": ["a value over the limit"],
            "complexity": "low",
        }
    )


class FakeLane:
    """Answers every request with `answer(symbol name)`; records what it was asked."""

    def __init__(self, answer: Callable[[str], str], parsed: bool) -> None:
        self.answer, self.parsed = answer, parsed
        self.asked: list[str] = []
        self.prompts: list[str] = []

    def __call__(self, requests: Sequence[BatchRequest]) -> BatchResult:
        items = []
        for index, request in enumerate(requests):
            self.asked.append(request.id)
            self.prompts.append(request.messages[-1].content)
            text = self.answer(request.id.split("::", 1)[1])
            items.append(
                ItemResult(
                    index=index,
                    id=request.id,
                    key=str(index),
                    status="ok",
                    text=text,
                    parsed=json.loads(text) if self.parsed else None,
                )
            )
        return BatchResult.model_construct(results=items, summary=summarize(items, 0.1), server=None)


def snapshots(tmp_path: Path) -> tuple[Path, list[Snapshot]]:
    repo = tmp_path / "repo"
    days = [
        {"pkg/scaling.py": module(), "pkg/broken.py": "def broken(:\n", "tests/test_scaling.py": TESTS},
        {"pkg/scaling.py": module(edited=7)},
    ]
    for day, files in enumerate(days, start=1):
        when = datetime(2026, 11, day, 10, tzinfo=UTC)
        build_history(repo, [CommitSpec(when=when, message=f"day {day}", files=files)])
    rules = SelectionRules(include=["**/*.py"], exclude=["tests/**"], max_file_bytes=MAX_FILE_BYTES)
    taken = [take_snapshot("big", repo, "HEAD", date(2026, 11, d), "UTC", rules, 4000) for d in (1, 2)]
    return repo, taken


def analysis_day(store: ArtifactStore, questions: SymbolQuestions) -> AnalysisDay:
    register = CoverageRegister(Memo(store, COVERAGE), "analysis")
    return AnalysisDay(questions, Memo(store, "tests_register"), register, "m", 128)


def chosen(store: ArtifactStore, snapshot: Snapshot, repo: Path, backlog_per_day: int = 100) -> DaySelection:
    """The day's symbols, as the day_symbols asset chooses them."""
    return select_day(Memo(store, "tests_register"), snapshot, repo, backlog_per_day)


def test_a_module_over_max_file_bytes_is_analysed_symbol_by_symbol_and_an_edit_reasks_one(
    tmp_path: Path,
) -> None:
    repo, (day1, day2) = snapshots(tmp_path)
    assert day1.file("pkg/scaling.py").size > MAX_FILE_BYTES
    assert day1.left_out == [] and [f.path for f in day1.files] == ["pkg/broken.py", "pkg/scaling.py"]
    store = ArtifactStore(tmp_path / "artifacts")
    lane = FakeLane(analysis_of, parsed=True)
    questions = SymbolQuestions("repo_analysis", Memo(store, "analysis"))
    day = analysis_day(store, questions)

    row, covered = day.run(day1, chosen(store, day1, repo), lane)
    assert len(lane.asked) == FUNCTIONS and questions.asked == FUNCTIONS
    assert [f.symbol for f in row.files] == [f"scale_{i}" for i in range(FUNCTIONS)]
    assert all(f.path == "pkg/scaling.py" and f.accepted for f in row.files)
    assert covered is not None and (covered.symbols, covered.analysed) == (FUNCTIONS, FUNCTIONS)
    assert "import math" in lane.prompts[0] and "def scale_0(" in lane.prompts[0]
    # Only a file Python cannot parse has no symbols; it is listed with the reason.
    assert day.not_scanned == [("big", "pkg/broken.py", "SyntaxError line 1: invalid syntax")]

    # A re-run of day 1 asks nothing and gives the same rows.
    lane.asked.clear()
    assert day.run(day1, chosen(store, day1, repo), lane)[0] == row and lane.asked == []

    # Day 2 edits scale_7 only: only it is asked; every other symbol's answer comes from the memo.
    hits = questions.memo.hits
    row2, covered2 = day.run(day2, chosen(store, day2, repo), lane)
    assert lane.asked == ["big:pkg/scaling.py::scale_7"]
    assert questions.memo.hits - hits == FUNCTIONS - 1
    assert row2.files[0].symbol == "scale_7"  # the changed symbol first, then the backlog
    assert covered2 is not None and covered2.analysed == FUNCTIONS


def test_refactors_of_the_days_symbols_are_confined_to_their_lines(tmp_path: Path) -> None:
    repo, (day1, _) = snapshots(tmp_path)
    store = ArtifactStore(tmp_path / "artifacts")
    selections = Memo(store, "tests_register")
    AnalysisDay(
        SymbolQuestions("repo_analysis", Memo(store, "analysis")),
        selections,
        CoverageRegister(Memo(store, COVERAGE), "analysis"),
        "m",
        128,
    ).run(day1, chosen(store, day1, repo, 2), FakeLane(analysis_of, parsed=True))

    doc, line, after = function(0).splitlines()[1:4]

    def answer(name: str) -> str:
        # Every answer rewrites scale_0's scaling line (numbered wrongly, line 3): inside scale_0 only.
        hunk = f"@@ -3,3 +3,3 @@\n {doc}\n-{line}\n+    scaled = value\n {after}\n"
        return f"```diff\n--- a/pkg/scaling.py\n+++ b/pkg/scaling.py\n{hunk}```"

    lane = FakeLane(answer, parsed=False)
    questions = SymbolQuestions("refactor_proposals", Memo(store, "refactor_diff"))
    judge = DiffJudge(Memo(store, "diff_check"), SandboxLimits(timeout_s=60, runs=1))
    day = RefactorDay(
        questions,
        judge,
        selections,
        CoverageRegister(Memo(store, COVERAGE), "refactor"),
        "m",
        128,
    )
    rows, covered = day.run(day1, repo, chosen(store, day1, repo, 2), [], lane)
    # The same two symbols analysis took (the remembered selection), most referenced first then by line.
    assert [r.symbol for r in rows] == ["scale_0", "scale_1"] and len(lane.asked) == 2
    inside, outside = rows
    assert inside.verdict == "accepted", inside.reason
    assert inside.diff is not None and "@@ -7,3 +7,3 @@" in inside.diff  # placed where its lines are
    assert outside.verdict == "outside_symbol" and "outside the symbol's lines" in outside.reason
    assert covered is not None and (covered.analysed, covered.with_accepted_proposal) == (2, 1)


def test_the_prompt_shows_the_symbol_with_its_context_and_its_lines() -> None:
    source = (
        "import re\n\n\ndef helper(x):\n    '''Strip it.'''\n    return x.strip()\n\n\n"
        "def clean(text):\n    return re.sub('a', '', helper(text))\n"
    )
    clean = extract_symbols("pkg/text.py", source).symbols[1]
    prompt = symbol_prompt(clean)
    assert prompt.startswith(
        "Symbol: `clean` (function) of module `pkg.text`\nFile: pkg/text.py, lines 9-10\n"
    )
    assert (
        prompt.index("import re")
        < prompt.index('def helper(x):\n    """Strip it."""')
        < prompt.index("Source:")
    )
    assert prompt.endswith("```python\ndef clean(text):\n    return re.sub('a', '', helper(text))\n```")


@pytest.mark.parametrize(
    ("public_api", "accepted", "reason"),
    [
        (["Box", "Box.area"], True, ""),
        (["scale"], False, "public_api names 'scale', which the file does not define"),
        (["https://example.com/api"], False, "which the file does not define"),
    ],
)
def test_an_analysis_may_name_only_what_the_symbol_defines(
    public_api: list[str], accepted: bool, reason: str
) -> None:
    source = "class Box:\n    def area(self):\n        return 1\n\n\ndef scale(x):\n    return x\n"
    box = extract_symbols("shapes.py", source).symbols[0]
    assert symbol_defines(box) == {"Box", "area"}
    analysis = FileAnalysis(
        summary="A box with an area.", public_api=public_api, risks=[], test_ideas=[], complexity="low"
    )
    row = symbol_row(box, "blob", AnalysisAnswer(status="ok", analysis=analysis))
    assert row.symbol == "Box" and row.accepted is accepted and reason in row.reason

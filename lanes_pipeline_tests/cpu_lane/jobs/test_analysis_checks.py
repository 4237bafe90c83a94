"""The analysis gate's checks: each fails on one kind of nonsense a small model writes (the examples are
real answers of SmolLM2-135M), and a sound analysis passes them all."""

from __future__ import annotations

import pytest

from lanes_pipeline.cpu_lane.jobs.analysis_checks import analysis_problem, degenerate, has_real_body
from lanes_pipeline.cpu_lane.jobs.tasks import FileAnalysis
from lanes_pipeline.repos.symbols import Symbol, extract_symbols

SOURCE = '''
def extract_file(archive, name):
    """Read one member of a zip archive as text."""
    with archive.open(name) as member:
        return member.read().decode("utf-8")


def later(x):
    raise NotImplementedError
'''


def symbol(name: str) -> Symbol:
    return next(s for s in extract_symbols("pkg/zips.py", SOURCE).symbols if s.name == name)


def analysis(summary: str, **fields: list[str]) -> FileAnalysis:
    return FileAnalysis(
        summary=summary,
        public_api=fields.get("public_api", []),
        risks=fields.get("risks", []),
        test_ideas=fields.get("test_ideas", []),
        complexity="low",
    )


def test_a_sound_analysis_is_accepted() -> None:
    sound = analysis(
        "Reads one member of a zip archive and decodes it as UTF-8 text.",
        public_api=["extract_file"],
        risks=["a member that is not UTF-8 raises UnicodeDecodeError"],
        test_ideas=["extract a small text member"],
    )
    assert analysis_problem(sound, symbol("extract_file")) is None


@pytest.mark.parametrize(
    ("summary", "reason"),
    [
        ("The more you read the more you learn about the more you learn about.", "degenerate text"),
        ("Extracts the file of a file, it's a file of a file.", "degenerate text"),
        ("The 1st 10000000000000000000000 archive member.", "degenerate text: a run of '0'"),
        ("The code is not available for the current version of Python. Please", "cut off mid-sentence"),
        ("The code is incomplete. Please help me to complete it.", "talks to the user"),
        ("The code is a bit of a puzzle, but it works.", "talks to the user"),
        ("This function is not implemented yet for members.", "claims 'not implemented'"),
        ("Computes the weather forecast for tomorrow.", "names nothing of the symbol's code"),
        ("Short one", "too short"),
    ],
)
def test_nonsense_is_rejected_with_its_reason(summary: str, reason: str) -> None:
    problem = analysis_problem(analysis(summary), symbol("extract_file"))
    assert problem is not None and reason in problem, problem


def test_saying_a_stub_is_not_implemented_is_true() -> None:
    honest = analysis("Raises NotImplementedError: later is not implemented yet.")
    assert not has_real_body(symbol("later")) and has_real_body(symbol("extract_file"))
    assert analysis_problem(honest, symbol("later")) is None


def test_a_loop_in_a_list_item_and_a_repeated_item_are_rejected() -> None:
    summary = "Reads a zip archive member as text."
    looping = analysis(summary, risks=["the member the member the member the member"])
    assert "degenerate text" in (analysis_problem(looping, symbol("extract_file")) or "")
    repeated = analysis(summary, test_ideas=["read a member", "Read a member"])
    assert analysis_problem(repeated, symbol("extract_file")) == "test_ideas repeats itself"
    invented = analysis(summary, public_api=["unzip_all"])
    assert "does not define" in (analysis_problem(invented, symbol("extract_file")) or "")


def test_different_phrases_sharing_three_words_are_not_a_loop() -> None:
    assert degenerate("Returns the number of rows and the number of columns.") is None
    assert degenerate("Pads 12 cells to 100 characters.") is None

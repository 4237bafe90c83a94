"""The analysis gate's checks: each fails on one kind of nonsense a small model writes (the examples are
real answers of SmolLM2-135M), and a sound analysis passes them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.jobs.analysis_checks import (
    MIN_PRECISION,
    LabelledAnalysis,
    analysis_problem,
    claim_problem,
    degenerate,
    gate_precision,
    has_real_body,
    load_labels,
)
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


def labelled(summary: str, label: str, name: str = "extract_file") -> LabelledAnalysis:
    return LabelledAnalysis(
        id=f"t:{summary[:20]}", symbol=symbol(name), analysis=analysis(summary), label=label
    )


def test_precision_is_the_share_of_sound_analyses_among_the_accepted() -> None:
    entries = [
        labelled("Reads one member of a zip archive as UTF-8 text.", "sound"),
        labelled("Opens the archive member by name and decodes it.", "sound"),
        labelled("Reads the member of the archive as text, twice.", "nonsense"),  # accepted: a miss
        labelled("The code is incomplete. Please help me to complete it.", "nonsense"),  # rejected
    ]
    gate = gate_precision(entries)
    assert (gate.labelled, gate.accepted, gate.sound_accepted, gate.nonsense) == (4, 3, 2, 2)
    assert gate.precision == pytest.approx(0.6667) and gate.nonsense_caught == 0.5
    assert gate.explanations_trained is False
    assert gate_precision(entries[:2]).explanations_trained is True
    assert gate_precision(entries[3:]).precision is None  # nothing accepted: nothing to trust


def test_the_labelled_real_analyses_measure_the_checks() -> None:
    entries = load_labels()
    assert len(entries) >= 50
    assert {e.label for e in entries} == {"sound", "nonsense"}
    assert len({e.id for e in entries}) == len(entries)
    gate = gate_precision(entries)
    assert gate.labelled == len(entries) and gate.accepted <= gate.labelled
    # the decision follows the figure: explanations train only at MIN_PRECISION or above
    assert gate.explanations_trained is (gate.precision is not None and gate.precision >= MIN_PRECISION)


def test_a_bad_label_file_names_the_file_and_the_entry(tmp_path: Path) -> None:
    good = labelled("Reads one member of a zip archive as UTF-8 text.", "sound").model_dump(mode="json")
    path = tmp_path / "labels.json"
    path.write_text(json.dumps([good, good | {"id": "x:broken", "label": "maybe"}]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"labels.json: entry 1 \(x:broken\)"):
        load_labels(path)
    path.write_text("[", encoding="utf-8")
    with pytest.raises(ValueError, match="cannot read the labelled analyses"):
        load_labels(path)


MATHBITS = (Path(sample_repo.__file__).parent / "day3" / "mathbits.py").read_text(encoding="utf-8")


def math_symbol(name: str) -> Symbol:
    return next(s for s in extract_symbols("mathbits.py", MATHBITS).symbols if s.name == name)


@pytest.mark.parametrize(
    ("name", "summary", "problem"),
    [
        ("clamp", "Limits `value` to [low, high] and raises ValueError when `low` is above `high`.", None),
        ("clamp", "Limits the value with `bound_check` and returns it.", "names `bound_check`, which is not"),
        ("clamp", "Limits the value; raises KeyError for a missing bound.", "says KeyError is raised"),
        ("clamp", "Limits the value with max() and min() and returns it.", None),
        ("clamp", "Limits the value and returns nothing.", "says clamp returns nothing, but it returns"),
        ("clamp", "Limits the value; it calls `sorted` on the bounds.", "says clamp calls `sorted`"),
        ("lcm", "Least common multiple of two numbers; it calls `gcd` of the module.", None),
        # A subscript or a division raises on its own: an analysis may say so.
        ("lcm", "Least common multiple; the `//` by gcd() raises ZeroDivisionError for a 0 divisor.", None),
    ],
)
def test_a_claim_the_code_contradicts_is_refused(name: str, summary: str, problem: str | None) -> None:
    found = claim_problem(analysis(summary), math_symbol(name))
    assert (found is None) if problem is None else (found or "").startswith(problem), found
    if problem is not None:
        assert (analysis_problem(analysis(summary), math_symbol(name)) or "").startswith(
            "contradicts the code"
        )


def test_a_procedure_said_to_return_a_value_is_refused() -> None:
    source = "def save(store, key, value):\n    store[key] = value\n"
    save = next(s for s in extract_symbols("store.py", source).symbols if s.name == "save")
    assert claim_problem(analysis("Saves `value` under `key` in the store."), save) is None
    found = claim_problem(analysis("Saves the pair and returns the previous `value`."), save)
    assert found == "says save returns a value, but it returns none"

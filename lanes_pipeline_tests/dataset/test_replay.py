"""Replay rows: standard-library functions, a different few each day, in the day's own two row forms."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from lanes_pipeline.dataset.replay import REPLAY_REPO, replay_candidates, replay_functions, stdlib_dir

MODULE = (
    '''import re


def tidy(text):
    """Collapse runs of spaces."""
    text = text.strip()
    return re.sub(" +", " ", text)


def shout(text):
    loud = text.upper()
    return loud + "!"


def one(x):
    return x


def long_one(x):
'''
    + "".join(f"    x += {i}\n" for i in range(50))
    + "    return x\n"
)


def test_a_day_takes_its_functions_by_hash_as_body_and_completion_rows(tmp_path: Path) -> None:
    (tmp_path / "tidy.py").write_text(MODULE, encoding="utf-8")
    functions = replay_functions(tmp_path, ("tidy.py", "missing.py"))
    assert [s.name for s, _ in functions] == ["tidy", "shout"]  # one and long_one too short, too long
    rows = replay_candidates(date(2026, 11, 2), functions, 1, 3000, 8)
    assert [r.task for r in rows] == ["write_body", "complete"] and {r.repo for r in rows} == {REPLAY_REPO}
    assert rows[1].symbol == rows[0].symbol
    days = {d: replay_candidates(date(2026, 11, d), functions, 1, 3000, 8)[0].symbol for d in range(1, 9)}
    assert set(days.values()) == {"tidy", "shout"}  # days differ in what they replay
    assert replay_candidates(date(2026, 11, 2), functions, 1, 3000, 8) == rows  # and a day is stable


def test_the_standard_library_gives_plenty() -> None:
    functions = replay_functions(stdlib_dir())
    assert len(functions) >= 100
    assert all(symbol.kind == "function" for symbol, _ in functions)

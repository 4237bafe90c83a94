"""Replay rows against forgetting: general Python code that is none of the judged repositories, none of the
anchor set's packages and not HumanEval, in the same two forms the day's own rows take ("write the body"
and a completion row). The source is the standard library of the interpreter the pipeline runs on (on
disk everywhere, licensed for this, written by many hands); each day takes a different few functions,
chosen by hash of the day, so the window replays a spread of them.
"""

from __future__ import annotations

import hashlib
import sysconfig
from datetime import date
from pathlib import Path

from lanes_pipeline.dataset.completion_rows import completion_rows
from lanes_pipeline.dataset.holdout_rules import body_candidate
from lanes_pipeline.dataset.writer import Candidate
from lanes_pipeline.repos.symbols import Symbol, extract_symbols

REPLAY_REPO = "python-stdlib"
# Plain pure-Python modules of the standard library (no platform code, no generated tables).
REPLAY_MODULES = (
    "bisect.py",
    "calendar.py",
    "colorsys.py",
    "csv.py",
    "difflib.py",
    "fnmatch.py",
    "fractions.py",
    "glob.py",
    "heapq.py",
    "posixpath.py",
    "shlex.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
)
MAX_FUNCTION_LINES = 40  # longer functions make rows the sequence length cuts anyway


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def replay_functions(folder: Path, modules: tuple[str, ...] = REPLAY_MODULES) -> list[tuple[Symbol, str]]:
    """Every top-level function of `modules` in `folder` with a body of a few lines, and its file's text."""
    found = []
    for name in modules:
        path = folder / name
        if not path.is_file():
            continue  # another Python may lack one: the others still replay
        source = path.read_text(encoding="utf-8")
        for symbol in extract_symbols(name, source).symbols:
            lines = symbol.end_line - symbol.start_line + 1
            if symbol.kind == "function" and 3 <= lines <= MAX_FUNCTION_LINES:
                found.append((symbol, source))
    return found


def replay_candidates(
    day: date, functions: list[tuple[Symbol, str]], count: int, context_chars: int, lines: int
) -> list[Candidate]:
    """`count` functions for `day` (by a hash of the day and each function's id): a "write the body" row
    and one completion row each."""

    def order(item: tuple[Symbol, str]) -> str:
        return hashlib.sha256(f"{day.isoformat()}:{item[0].id}".encode()).hexdigest()

    rows: list[Candidate] = []
    for symbol, source in sorted(functions, key=order)[:count]:
        rows.append(body_candidate(REPLAY_REPO, symbol))
        rows += completion_rows(REPLAY_REPO, symbol, source, [], context_chars, cuts=1, lines=lines)
    return rows

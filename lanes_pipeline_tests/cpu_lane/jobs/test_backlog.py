"""The day's work: changed symbols first, then the backlog, most referenced first; coverage figures."""

from __future__ import annotations

import math
import shlex
import textwrap
from pathlib import Path

import pytest

from lanes_pipeline.cpu_lane.jobs.backlog import choose_work, coverage
from lanes_pipeline.repos.symbols import all_symbols, reference_counts, scan_repo

SOURCES = {
    "textwrap.py": Path(textwrap.__file__).read_text(encoding="utf-8"),
    "shlex.py": Path(shlex.__file__).read_text(encoding="utf-8"),
}
SYMBOLS = all_symbols(scan_repo(SOURCES, max_class_lines=80))
REFERENCES = reference_counts(SOURCES, SYMBOLS)


def test_a_fresh_install_takes_the_most_referenced_symbols_first_in_a_stable_order() -> None:
    work = choose_work(SYMBOLS, covered=set(), changed=set(), backlog_per_day=5, references=REFERENCES)
    assert work.changed == [] and len(work.backlog) == 5
    counts = [REFERENCES[i] for i in work.backlog]
    assert counts == sorted(counts, reverse=True)
    assert max(REFERENCES.values()) == counts[0]
    assert work.remaining == len(SYMBOLS) - 5
    again = choose_work(list(reversed(SYMBOLS)), set(), set(), 5, REFERENCES)
    assert again == work  # input order does not matter


def test_changed_symbols_come_first_then_the_backlog_and_the_repository_is_covered_in_ceil_days() -> None:
    budget = 7
    covered: set[str] = set()
    days = 0
    while True:
        work = choose_work(SYMBOLS, covered, changed=set(), backlog_per_day=budget, references=REFERENCES)
        if not work.ids:
            break
        days += 1
        covered |= set(work.ids)
    assert days == math.ceil(len(SYMBOLS) / budget)
    assert work.remaining == 0
    edited = next(s for s in SYMBOLS if s.name == "dedent")
    new_version = edited.model_copy(update={"memo_key": "edited"})
    today = [new_version if s.id == edited.id else s for s in SYMBOLS]
    work = choose_work(today, covered, changed={edited.id}, backlog_per_day=budget, references=REFERENCES)
    assert work.changed == [edited.id] and work.backlog == []


def test_covered_by_memo_key_counts_and_a_changed_symbol_already_seen_in_this_form_is_not_asked() -> None:
    first = SYMBOLS[0]
    work = choose_work(SYMBOLS, {first.memo_key}, changed={first.id}, backlog_per_day=1000)
    assert first.id not in work.ids and len(work.ids) == len(SYMBOLS) - 1
    with pytest.raises(ValueError, match="backlog_per_day"):
        choose_work(SYMBOLS, set(), set(), -1)


def test_coverage_per_repository() -> None:
    ids = [s.id for s in SYMBOLS]
    figures = coverage(
        "stdlib", SYMBOLS, analysed=set(ids[:10]), tested={SYMBOLS[0].memo_key}, proposed=set()
    )
    assert (figures.symbols, figures.analysed, figures.with_accepted_test) == (len(SYMBOLS), 10, 1)
    assert figures.with_accepted_proposal == 0
    assert figures.share("analysed") == round(10 / len(SYMBOLS), 4)
    assert coverage("empty", [], set(), set(), set()).share("analysed") == 0.0

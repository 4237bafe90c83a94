"""The hostile corpus through the review branch (issue: nothing reaches a user's repository that runs code
the gate did not allow). Every test, docstring and diff answer of the corpus and of the denylist's misses
(`hostile_corpus.review_corpus`) is made into the items it could become if its gate had accepted it, as
the assets build them (oracle tests from the calls it proposes, the docstring written into its symbol, the
diff confined to its symbol) and as it was written (the raw module, the docstring pasted in, the diff as
sent). None of them may put its payload on the branch; each control must. Pure, then once through git on
the sample repository's day 1. Analyses never become commits (`review_items` takes no analysis)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import pytest

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.jobs.docstring_edit import DocstringError, document, unified_diff
from lanes_pipeline.cpu_lane.jobs.docstrings import read_docstring
from lanes_pipeline.cpu_lane.jobs.oracle_tests import answer_text, symbol_test_path
from lanes_pipeline.cpu_lane.jobs.oracles import Observation, oracle_test_file, parse_calls
from lanes_pipeline.cpu_lane.jobs.review import ReviewItem, added_text, item_problem
from lanes_pipeline.cpu_lane.jobs.review_branch import identity, write_branch
from lanes_pipeline.cpu_lane.jobs.symbol_diff import apply_confined, confine_to_symbol
from lanes_pipeline.cpu_lane.jobs.tasks import extract_block, parse_diff
from lanes_pipeline.git import build_history
from lanes_pipeline.repos.symbols import Symbol, all_symbols, scan_repo
from lanes_pipeline_tests.cpu_lane.hostile_corpus import HostileAnswer, denylist_misses, review_corpus

DAY1 = Path(sample_repo.__file__).parent / "day1"
SOURCES = {name: (DAY1 / name).read_text() for name in ("mathbits.py", "textstats.py")}
# Where an answer aimed at no symbol goes: one whose parameters its examples name (`n`).
DEFAULT_SYMBOL = "mathbits.py::is_prime"
COMMITTED = ("test", "docstring", "diff")
Candidate = tuple[ReviewItem, str | None, str | None]  # the item, its file before and after (None: unknown)


@cache
def symbols() -> dict[str, Symbol]:
    return {s.id: s for s in all_symbols(scan_repo(SOURCES))}


def _item(entry: HostileAnswer, symbol: Symbol, **change: str | None) -> ReviewItem:
    kind = {"test": "test", "docstring": "docstring", "diff": "refactor"}[entry.stage]
    path = symbol_test_path(symbol) if kind == "test" else symbol.path
    return ReviewItem(
        kind=kind,  # type: ignore[arg-type]
        repo="sample",
        path=path,
        source_path=symbol.path,
        module=symbol.module,
        symbol=symbol.name,
        evidence="accepted by its gate",
        **change,  # type: ignore[arg-type]
    )


def _tests(entry: HostileAnswer, symbol: Symbol) -> list[Candidate]:
    answer = answer_text(symbol, "oracle", entry.text)
    found: list[Candidate] = []
    calls = parse_calls(answer, symbol.name).calls
    if calls:  # what the sandbox would have written from its calls (any observed value will do here)
        observed = [Observation(call=call, status="value", value_repr="0") for call in calls]
        code = oracle_test_file(symbol.module, symbol.name, observed)
        found.append((_item(entry, symbol, content=code), None, code))
    raw = extract_block(answer, ("python",))
    found.append((_item(entry, symbol, content=raw), None, raw))
    return found


def _pasted(symbol: Symbol, source: str, text: str) -> str:
    """The answer pasted in after the `def` line as it came, closing quotes and all."""
    lines = source.splitlines(keepends=True)
    return "".join([*lines[: symbol.start_line], f'    """{text}\n', *lines[symbol.start_line :]])


def _docstrings(entry: HostileAnswer, symbol: Symbol) -> list[Candidate]:
    source = SOURCES[symbol.path]
    found: list[Candidate] = []
    try:
        literal, value = read_docstring(symbol, entry.text)
        documented = document(symbol, source, literal)
    except (DocstringError, SyntaxError):
        pass
    else:
        change = {"patch": documented.diff, "docstring": value}
        found.append((_item(entry, symbol, **change), source, documented.file_source))
    pasted = _pasted(symbol, source, entry.text)
    change = {"patch": unified_diff(symbol.path, source, pasted), "docstring": entry.text}
    found.append((_item(entry, symbol, **change), source, pasted))
    return found


def _diffs(entry: HostileAnswer, symbol: Symbol) -> list[Candidate]:
    source = SOURCES[symbol.path]
    found: list[Candidate] = []
    parsed = parse_diff(entry.text, symbol.path)
    confined = parsed if isinstance(parsed, tuple) else confine_to_symbol(parsed, source, symbol)
    if not isinstance(confined, tuple):
        after = apply_confined(confined, source)
        found.append((_item(entry, symbol, patch=confined.text), source, after))
    raw = extract_block(entry.text, ("diff",)).strip("\n") + "\n"
    found.append((_item(entry, symbol, patch=raw), source, None))  # only git knows where it lands
    return found


def candidates(entry: HostileAnswer) -> list[Candidate]:
    symbol = symbols()[entry.symbol or DEFAULT_SYMBOL]
    return {"test": _tests, "docstring": _docstrings, "diff": _diffs}[entry.stage](entry, symbol)


def _entries() -> list[HostileAnswer]:
    return [e for e in review_corpus() if e.stage in COMMITTED]


def _payload_in(entry: HostileAnswer, text: str) -> list[str]:
    return [m for m in entry.markers if m in text] + ([entry.text] if entry.text in text else [])


def test_the_review_corpus_holds_every_hostile_answer_and_the_denylists_misses() -> None:
    entries = _entries()
    assert len(entries) == 45 + 15 + 45 + 10  # the served day's tests, diffs, docstrings, and the misses
    assert {e.name for e in denylist_misses()} <= {e.name for e in entries}
    assert {e.stage for e in entries if e.control} == set(COMMITTED)


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e.name)
def test_no_hostile_payload_passes_the_filter_and_each_control_does(entry: HostileAnswer) -> None:
    passed = [
        added_text(before, after)
        for item, before, after in candidates(entry)
        if after is not None and item_problem(item, before, after) is None
    ]
    landed = "\n".join(passed)
    if entry.control:
        assert passed and all(m in landed for m in entry.markers)
    else:
        assert _payload_in(entry, landed) == []


def test_the_whole_corpus_through_git_leaves_no_payload_on_the_branch(tmp_path: Path) -> None:
    repo = tmp_path / "sample"
    base = build_history(repo, sample_repo.history()[:1])
    entries = _entries()
    items = [item for entry in entries for item, _, _ in candidates(entry)]
    written = write_branch(repo, "sample", base, "2026-11-01", items, identity("2026-11-01", "UTC"))
    log = subprocess.run(
        ["git", "-C", str(repo), "log", "-p", f"{base}..lanes/2026-11-01"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    reached = {e.name: _payload_in(e, log) for e in entries if not e.control}
    assert {name: found for name, found in reached.items() if found} == {}
    for control in (e for e in entries if e.control):
        assert all(m in log for m in control.markers), control.name
    assert written.commits < len(items) and all(r.reason for r in written.rows if r.status == "skipped")

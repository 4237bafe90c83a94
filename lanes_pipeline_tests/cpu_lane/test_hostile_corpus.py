"""The hostile corpus and its seam, pure (the run through the real server: test_hostile_assets.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest
from lanes_pipeline.cpu_lane.jobs.docstrings import unsafe_examples
from lanes_pipeline.cpu_lane.jobs.tasks import FileAnalysis, extract_block, parse_diff
from lanes_pipeline.http import ChatMessage, ChatRequest
from lanes_pipeline.sandbox.safety import unsafe_code_added
from lanes_pipeline_tests.cpu_lane.hostile_corpus import (
    HostileAnswer,
    corpus,
    denylist_misses,
    fast_part,
    review_corpus,
)
from lanes_pipeline_tests.cpu_lane.hostile_lane import (
    UNMATCHED_TEXT,
    HostileDeliveries,
    exact_grammar,
    expected_reply,
)

DAY1 = Path(sample_repo.__file__).parent / "day1"
# What one day of the assets asks on the sample's day 1: 15 symbols, 3 samples of tests and docstrings.
REQUESTS_PER_STAGE = {"analysis": 15, "test": 45, "diff": 15, "docstring": 45}
# ... and with one sample of each (the fast tier's hostile day).
ONE_SAMPLE_REQUESTS = {"analysis": 15, "test": 15, "diff": 15, "docstring": 15}


def test_the_corpus_covers_every_stage_and_kind_of_attack() -> None:
    entries = corpus()
    assert len(entries) >= 100
    assert Counter(e.stage for e in entries) == REQUESTS_PER_STAGE
    categories = {e.category for e in entries}
    assert categories >= {
        "prompt_injection",
        "path_traversal",
        "absolute_path",
        "process",
        "network",
        "ctypes",
        "dynamic_code",
        "fork_bomb",
        "huge_output",
        "secret",
        "no_target",
        "write_outside",
        "read_host",
        "infinite_loop",
        "delete_files",
    }
    for stage in REQUESTS_PER_STAGE:
        assert "prompt_injection" in {e.category for e in entries if e.stage == stage}, stage


def test_the_fast_part_makes_every_kind_of_attack_and_fits_one_sample_per_symbol() -> None:
    part = fast_part()
    assert Counter(e.stage for e in part) == ONE_SAMPLE_REQUESTS  # each entry answers one request
    assert {e.category for e in part} == {e.category for e in corpus()}
    assert {e.name for e in part if e.control} == {e.name for e in corpus() if e.control}
    for stage in ONE_SAMPLE_REQUESTS:  # one request per symbol: two aimed at one symbol could not both go
        aimed = [e.symbol for e in part if e.stage == stage and e.symbol is not None]
        assert len(aimed) == len(set(aimed)), stage


def test_analyses_are_the_json_the_stage_expects_unless_meant_to_be_broken() -> None:
    for entry in corpus():
        if entry.stage != "analysis":
            continue
        if entry.category == "malformed":
            with pytest.raises(ValueError):
                FileAnalysis.model_validate_json(entry.text)
        else:
            FileAnalysis.model_validate_json(entry.text)


def test_aimed_diffs_parse_apply_and_their_context_is_the_symbols_lines(tmp_path: Path) -> None:
    aimed = [e for e in corpus() if e.stage == "diff" and e.symbol is not None]
    assert len(aimed) == 10  # 9 hostile, and the harmless control
    _aimed_diffs_apply_in_their_symbol(aimed, tmp_path)


# The answers the denylist passes (issue: an allowlist where one fits), each as a doctest and as a diff.
MISSED = (
    "getattr(__builtins__, 'ev'+'al')('1+1')",
    "().__class__.__base__.__subclasses__()",
    "import os; getattr(os, 'sys'+'tem')('id')",
    "import atexit; atexit.register(",
    "open(path, 'w')",
)


def test_the_denylists_misses_are_each_a_doctest_and_a_diff_beside_the_served_corpus() -> None:
    misses = denylist_misses()
    assert Counter(e.stage for e in misses) == {"docstring": 5, "diff": 5}
    for payload in MISSED:
        assert {e.stage for e in misses if payload in e.text} == {"docstring", "diff"}, payload
    assert all(e.symbol is not None and not e.control for e in misses)
    # Beside the served day's corpus, whose counts stay one entry per request.
    assert {e.name for e in misses}.isdisjoint(e.name for e in corpus())
    assert len(review_corpus()) == len(corpus()) + len(misses)


def test_the_denylist_passes_each_miss_and_each_is_aimed_where_it_would_run(tmp_path: Path) -> None:
    source = (DAY1 / "mathbits.py").read_text()
    diffs = [e for e in denylist_misses() if e.stage == "diff"]
    _aimed_diffs_apply_in_their_symbol(diffs, tmp_path)
    for entry in diffs:
        patch = extract_block(entry.text, ("diff",)).strip("\n") + "\n"
        applied = subprocess.run(
            ["git", "apply", "-"], cwd=tmp_path, input=patch, text=True, capture_output=True, check=True
        )
        assert applied.returncode == 0
        after = (tmp_path / "mathbits.py").read_text()
        assert unsafe_code_added(source, after) == [], entry.name  # what the refactor gate checks
        (tmp_path / "mathbits.py").write_text(source)
    for entry in denylist_misses():
        if entry.stage == "docstring":
            docstring = entry.text.removesuffix('"""')
            assert unsafe_examples(docstring) == [], entry.name  # what the docstring gate checks


def _aimed_diffs_apply_in_their_symbol(aimed: list[HostileAnswer], tmp_path: Path) -> None:
    source = (DAY1 / "mathbits.py").read_text().splitlines()
    shutil.copy(DAY1 / "mathbits.py", tmp_path / "mathbits.py")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for entry in aimed:
        assert entry.symbol is not None
        path, name = entry.symbol.split("::")
        parsed = parse_diff(entry.text, path)
        assert not isinstance(parsed, tuple), (entry.name, parsed)
        patch = extract_block(entry.text, ("diff",)).strip("\n") + "\n"
        check = subprocess.run(
            ["git", "apply", "--check", "-"], cwd=tmp_path, input=patch, text=True, capture_output=True
        )
        assert check.returncode == 0, (entry.name, check.stderr)
        hunk = re.search(r"^@@ -(\d+),(\d+) ", entry.text, re.MULTILINE)
        assert hunk is not None
        start, count = int(hunk.group(1)), int(hunk.group(2))
        context = [line[1:] for line in entry.text.splitlines() if line.startswith(" ")]
        assert context == source[start - 1 : start - 1 + count], entry.name
        owner = max(i for i, line in enumerate(source[:start], 1) if line.startswith("def "))
        assert source[owner - 1].startswith(f"def {name}("), entry.name


def test_aimed_docstrings_name_the_parameters_and_call_the_symbol() -> None:
    source = (DAY1 / "mathbits.py").read_text()
    for entry in review_corpus():
        if entry.stage != "docstring" or entry.symbol is None:
            continue
        name = entry.symbol.split("::")[1]
        header = re.search(rf"^def {name}\((.*)\)", source, re.MULTILINE)
        assert header is not None
        params = [p.split(":")[0].strip() for p in header.group(1).split(",")]
        assert all(re.search(rf"\b{p}:", entry.text) for p in params), entry.name
        assert f">>> {name}(" in entry.text, entry.name


def test_the_exact_grammar_escapes_what_gbnf_would_read_otherwise() -> None:
    assert exact_grammar('a"b\\c\nd\te\r') == 'root ::= "a\\"b\\\\c\\nd\\te\\r"\n'
    assert exact_grammar("é€\x01") == 'root ::= "\\xE9\\u20AC\\x01"\n'


def test_the_expected_reply_stops_at_the_first_stop_string() -> None:
    assert expected_reply("1)\nf(2)\n```", ["```"]) == "1)\nf(2)\n"
    assert expected_reply('Does it."""\nimport os```', ['"""', "```"]) == "Does it."
    assert expected_reply("plain", None) == "plain"


def _entry(name: str, stage: str, symbol: str | None = None) -> HostileAnswer:
    return HostileAnswer(
        name=name, category="process", stage=stage, text=name, markers=(name,), symbol=symbol
    )  # type: ignore[arg-type]


def _request(request_id: str, seed: int = 0, text: str | None = None) -> BatchRequest:
    return BatchRequest(
        id=request_id, messages=[ChatMessage(role="user", content=text or request_id)], seed=seed
    )


def test_requests_get_aimed_entries_first_then_any_then_repeats() -> None:
    deliveries = HostileDeliveries(entries=[_entry("any", "test"), _entry("aimed", "test", "m.py::f")])
    requests = [_request(i) for i in ("oracle:m.py::g#s0", "oracle:m.py::f#s1", "oracle:m.py::f#s2")]
    deliveries.assign("generated_tests sample", requests)
    assert [deliveries.given[k].name for k in deliveries.given] == ["any", "aimed", "aimed"]
    assert deliveries.repeats == ["oracle:m.py::f#s2"]
    with pytest.raises(ValueError, match="no stage for batch label 'other x'"):
        deliveries.assign("other x", requests)


def test_a_request_gets_its_entry_its_repair_the_same_and_a_stranger_a_fixed_text() -> None:
    deliveries = HostileDeliveries(entries=[_entry("a_one", "analysis")])
    request = _request("sample:m.py::f", seed=3)
    deliveries.assign("repo_analysis sample", [request])
    chat = ChatRequest(model="m", messages=request.messages, seed=3, response_format={"type": "json_object"})
    sent, delivery, text = deliveries.rewrite(chat)
    assert (text, sent.grammar, sent.response_format) == ("a_one", exact_grammar("a_one"), None)
    assert delivery is not None and not delivery.repair
    repair = chat.model_copy(update={"messages": [*chat.messages, ChatMessage(role="user", content="fix")]})
    _, again, text = deliveries.rewrite(repair)
    assert again is not None and again.repair and text == "a_one"
    stranger = chat.model_copy(update={"seed": 4})
    _, none, text = deliveries.rewrite(stranger)
    assert none is None and text == UNMATCHED_TEXT and deliveries.unmatched == ["sample:m.py::f"]
    assert deliveries.delivered() == {"a_one"}

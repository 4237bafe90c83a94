"""Tests with teeth for one symbol: the request layout, verified sampling figures, the gate in the sandbox
on canned answers, and the real llama-server on the sample repository's functions."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

import lanes_pipeline.repos.sample_repo as sample_repo
from lanes_pipeline.cpu_lane.assets.generated_tests import symbol_row
from lanes_pipeline.cpu_lane.batching.answer_cache import ResponseCache, cache_key
from lanes_pipeline.cpu_lane.batching.batch import BatchResult, BatchRunner
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest, ItemFailure, ItemResult
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.jobs.backlog import day_work
from lanes_pipeline.cpu_lane.jobs.oracle_tests import (
    VerifyPlace,
    answer_text,
    prefill,
    repo_test_example,
    run_symbol_tests,
    symbol_test_batch,
    verify_symbol_answers,
    yield_of_tests,
)
from lanes_pipeline.cpu_lane.jobs.verified_sampling import TargetTally, kind_yield, samples_of
from lanes_pipeline.git import CommitSpec, build_history
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.repos.symbols import Symbol, all_symbols, scan_repo
from lanes_pipeline.sandbox.isolation import detect_isolation
from lanes_pipeline.settings import SandboxLimits, Settings
from lanes_pipeline_tests.cpu_lane.fixtures import batch_config, one_commit_place, private_cpu_server

DAY3 = Path(sample_repo.__file__).parent / "day3"
# The sample's first modules (textstats, slug) and their tests: what these tests were written against.
SOURCES = {
    path: text
    for path, text in sample_repo.tree_of(DAY3).items()
    if path.endswith(".py") and sample_repo.of_modules(path, sample_repo.FIRST_MODULES)
}
TESTS = {path: source for path, source in SOURCES.items() if path.startswith("tests/")}
REPO_MAP = "slug.py: slugify, unique_slug\ntextstats.py: words, word_count, top_words, average_word_length"


def code_symbols() -> list[Symbol]:
    return [s for s in all_symbols(scan_repo(SOURCES)) if not s.path.startswith("tests/")]


def symbol(name: str) -> Symbol:
    return next(s for s in code_symbols() if s.name == name)


def test_requests_keep_the_fixed_prefix_first_and_differ_per_sample_only_in_the_seed() -> None:
    slugify, words = symbol("slugify"), symbol("words")
    requests = symbol_test_batch([slugify, words], REPO_MAP, TESTS, samples=3)
    assert [r.id for r in requests[:3]] == [f"oracle:{slugify.id}#s{i}" for i in range(3)]
    assert [r.seed for r in requests[:3]] == [0, 1, 2] and all(r.temperature > 0 for r in requests)
    system = {r.messages[0].content for r in requests}
    assert len(system) == 1 and REPO_MAP in system.pop()  # one prefix for every target of the repository
    first, other = requests[0].messages, requests[3].messages
    assert [m.role for m in first] == ["system", "user", "assistant"]
    user = first[1].content
    # The varying part last: the repository's test of the target, then the context, then the source.
    assert user.index("def test_slugify_joins_words_with_hyphens") < user.index("import unicodedata")
    assert user.index("import unicodedata") < user.index("def slugify(") and user.endswith("`slugify`.")
    lead = "Write example calls of the target.\n"
    assert user.startswith(lead) and other[1].content.startswith(lead)
    assert "def test_words_are_lower_case" in other[1].content
    assert first[2].content == "```python\nfrom slug import slugify\n\nslugify("
    assert requests[0].stop == ["```"]
    keys = {cache_key(r.chat_request("m"), "weights") for r in requests}
    assert len(keys) == len(requests)  # distinct cache keys: no sample is another's cache hit
    assert prefill(slugify, "assertions").endswith("\n\n\ndef test_slugify")


def test_the_example_is_a_test_naming_the_target_else_the_first_and_none_without_tests() -> None:
    assert "def test_unique_slug_counts_up" in (repo_test_example(TESTS, symbol("unique_slug")) or "")
    example = repo_test_example(TESTS, symbol("average_word_length")) or ""
    assert example.startswith("# tests/test_slug.py\nfrom slug import slugify, unique_slug")
    assert repo_test_example({}, symbol("words")) is None
    assert repo_test_example({"tests/test_x.py": "def broken(:\n"}, symbol("words")) is None


def test_answer_text_adds_the_prefill_only_when_the_server_left_it_out() -> None:
    slugify = symbol("slugify")
    start = prefill(slugify, "oracle")
    assert answer_text(slugify, "oracle", "'a b')\n") == start + "'a b')\n"
    assert answer_text(slugify, "oracle", start + "'a b')\n") == start + "'a b')\n"


def test_kind_yield_and_samples() -> None:
    figures = kind_yield(
        [
            TargetTally(target="a", sampled=4, accepted=1),
            TargetTally(target="b", sampled=4, accepted=0),
            TargetTally(target="c", sampled=2, accepted=2),
        ]
    )
    assert (figures.asked, figures.sampled, figures.accepted, figures.targets_with_accepted) == (3, 10, 3, 2)
    assert figures.pass_at_1 == 0.3 and figures.pass_at_n == 0.6667
    assert kind_yield([]).pass_at_1 == 0.0 and kind_yield([]).asked == 0
    with pytest.raises(ValueError, match="'a': 2 accepted of 1 sampled"):
        kind_yield([TargetTally(target="a", sampled=1, accepted=2)])
    request = symbol_test_batch([symbol("words")], REPO_MAP, TESTS, samples=1)[0]
    with pytest.raises(ValueError, match="temperature above 0"):
        samples_of(request, 2, temperature=0.0)
    with pytest.raises(ValueError, match="samples must be >= 1"):
        samples_of(request, 0)


def answered(style: str, target: Symbol, sample: int, text: str) -> ItemResult:
    return ItemResult(index=0, id=f"{style}:{target.id}#s{sample}", key=f"k{sample}", status="ok", text=text)


# Model-written tests, as the server continues the prefill: `is not False` passes on the commit and on the
# `return None` mutant (no teeth); the exact value kills both mutants.
WEAK = "():\n    assert slugify('A b') is not False\n"
GOOD = "from slug import slugify\n\n\ndef test_slugify():\n    assert slugify('A b') == 'a-b'\n"


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> VerifyPlace:
    repo = tmp_path_factory.mktemp("sample") / "repo"
    day = CommitSpec(when=datetime(2026, 11, 3, tzinfo=UTC), message="day 3", files=dict(SOURCES))
    commit = build_history(repo, [day])
    return VerifyPlace(
        repo=repo,
        commit=commit,
        limits=SandboxLimits(timeout_s=30, memory_mb=768, runs=2),
        isolation=detect_isolation(),
    )


def test_answers_go_through_one_gate_in_the_sandbox(place: VerifyPlace) -> None:
    slugify = symbol("slugify")
    start = prefill(slugify, "oracle")
    oracle = [
        answered("oracle", slugify, 0, start + "'Hello, World!', max_length=10)\nslugify('a  b')\n"),
        answered("oracle", slugify, 1, "'a  b')\nslugify('Hello, World!', max_length=10)\n"),  # same test
        answered("oracle", slugify, 2, "title)\n"),  # a variable: no call to run
        answered("oracle", slugify, 3, "object())\n"),  # not a literal either
        ItemResult(
            index=0,
            id=f"oracle:{slugify.id}#s4",
            key="k4",
            status="failed",
            failure=ItemFailure(kind="too_long", reason="prompt of 5000 tokens"),
        ),
    ]
    [result] = verify_symbol_answers(place, [slugify], oracle, samples=6)
    statuses = [a.status for a in result.answers]
    assert statuses == ["accepted", "accepted", "no_calls", "no_calls", "no_answer", "no_answer"]
    assert "assert slugify('Hello, World!', max_length=10) == 'hello-worl'" in result.accepted_tests[0]
    assert len(result.accepted_tests) == 2  # call order differs: two distinct tests, each kept once
    assert result.answers[4].reason.startswith("too_long: prompt of 5000")
    assert yield_of_tests([result]).model_dump(exclude={"note"}) == {
        "asked": 1,
        "sampled": 6,
        "accepted": 2,
        "targets_with_accepted": 1,
        "pass_at_1": 0.3333,
        "pass_at_n": 1.0,
    }
    # Model-written assertions go through the same gate: the weak test survives `return None`.
    start = prefill(slugify, "assertions")
    written = [
        answered("assertions", slugify, 0, start + WEAK),
        answered("assertions", slugify, 1, start + "():\n    assert slugify('A b') == 'a-b'\n```"),
        answered("assertions", slugify, 2, "():\n    assert slugify('A b') == 'wrong'\n"),
        answered("assertions", slugify, 3, "():\n    pass\n"),
    ]
    [result] = verify_symbol_answers(place, [slugify], written, samples=4, style="assertions")
    verdicts = [(a.status, a.reason.split(":")[0]) for a in result.answers]
    assert verdicts == [
        ("survives_mutant", "survives the return_none mutant of slugify (passed)"),
        ("accepted", "passed 2 of 2 runs; fails on all 2 mutants of slugify"),
        ("fails_on_commit", "failure"),
        ("rejected_static", "trivial"),
    ]
    assert result.accepted_tests == [GOOD]


def test_an_exception_of_a_wrong_call_is_no_test(place: VerifyPlace) -> None:
    unique = symbol("unique_slug")
    items = [answered("oracle", unique, 0, "'a', 1)\n")]  # `1 in taken` on an int: TypeError
    [result] = verify_symbol_answers(place, [unique], items, samples=1)
    assert (result.answers[0].status, result.accepted_tests) == ("no_usable_result", [])
    assert (
        result.answers[0].reason
        == "every call raised (TypeError) and unique_slug raises none of it on purpose"
    )
    words = symbol("words")
    items = [answered("oracle", words, 0, "'x', 1, 2, 3)\n")]
    [result] = verify_symbol_answers(place, [words], items, samples=1)
    assert result.answers[0].status == "no_usable_result", result.answers[0].reason


MATHBITS = (DAY3 / "mathbits.py").read_text(encoding="utf-8")
MATHBITS_MAP = "mathbits.py: clamp, is_prime, gcd, lcm, digit_sum, mean, median, factorial"


@pytest.fixture(scope="module")
def mathbits_place(tmp_path_factory: pytest.TempPathFactory) -> VerifyPlace:
    return one_commit_place(tmp_path_factory.mktemp("mathbits"), {"mathbits.py": MATHBITS, "parse.py": PARSE})


# `int()` raises ValueError on its own as well as the guard does: a test of "x" proves no guard.
PARSE = """def parse_count(text):
    if text.startswith("-"):
        raise ValueError("a count is never negative")
    return int(text)
"""


def mathbits_symbol(name: str, path: str = "mathbits.py") -> Symbol:
    source = MATHBITS if path == "mathbits.py" else PARSE
    return next(s for s in all_symbols(scan_repo({path: source})) if s.name == name)


def test_an_exception_the_target_raises_on_purpose_is_kept_and_the_guard_mutant_proves_it(
    mathbits_place: VerifyPlace,
) -> None:
    median = mathbits_symbol("median")
    answer = "[3, 1, 2])\nmedian([4, 1, 3, 2])\nmedian([])\nmedian(3)\n"
    [result] = verify_symbol_answers(mathbits_place, [median], [answered("oracle", median, 0, answer)], 1)
    verdict = result.answers[0]
    assert verdict.status == "accepted", verdict.reason
    assert verdict.reason.endswith("fails on all 3 mutants of median")  # remove_raises is the third
    [test] = result.accepted_tests
    assert "with pytest.raises(ValueError):\n        median([])" in test
    assert "TypeError" not in test and "median(3)" not in test  # sorted() of an int: a wrong call
    assert verdict.left_out == ["median(3)"] and verdict.reviewer_refusal  # counted by cpu_yield
    row = symbol_row("r", result)
    assert (row.verdict, row.accepted_answers, row.reviewer_refusals) == ("passed", 1, 1)
    # Model-written: a wrong call is refused before anything runs; a test the guard does not decide dies
    # on remove_raises (int() raises the same ValueError without it).
    wrong = "():\n    import pytest\n\n    with pytest.raises(TypeError):\n        median(3)\n"
    [result] = verify_symbol_answers(
        mathbits_place, [median], [answered("assertions", median, 0, wrong)], 1, style="assertions"
    )
    assert result.answers[0].status == "rejected_static"
    assert result.answers[0].reason.startswith("unintended_exception: expects TypeError but median never")
    assert result.answers[0].reviewer_refusal
    parse = mathbits_symbol("parse_count", "parse.py")
    loose = "():\n    import pytest\n\n    with pytest.raises(ValueError):\n        parse_count('x')\n"
    [result] = verify_symbol_answers(
        mathbits_place, [parse], [answered("assertions", parse, 0, loose)], 1, style="assertions"
    )
    assert result.answers[0].status == "survives_mutant"
    assert result.answers[0].reason.startswith("survives the remove_raises mutant of parse_count")
    assert result.answers[0].reviewer_refusal
    guarded = loose.replace("parse_count('x')", "parse_count('-3')")
    [result] = verify_symbol_answers(
        mathbits_place, [parse], [answered("assertions", parse, 0, guarded)], 1, style="assertions"
    )
    assert result.answers[0].status == "accepted", result.answers[0].reason


def test_calls_down_the_same_path_are_thinned_to_the_first(mathbits_place: VerifyPlace) -> None:
    factorial = mathbits_symbol("factorial")
    answer = "0)\nfactorial(1)\nfactorial(5)\nfactorial(6)\nfactorial(10)\nfactorial(-1)\nfactorial(-4)\n"
    items = [answered("oracle", factorial, 0, answer)]
    [result] = verify_symbol_answers(mathbits_place, [factorial], items, 1)
    assert result.answers[0].status == "accepted", result.answers[0].reason
    [test] = result.accepted_tests
    # 0 and 1 skip the loop (1 returns its argument, 0 does not), 5, 6 and 10 run it, -1 and -4 hit the
    # guard: one call of each behaviour.
    assert "factorial(0) == 1" in test and "factorial(1) == 1" in test and "factorial(5) == 120" in test
    assert "factorial(-1)" in test
    for thinned_call in ("factorial(6)", "factorial(10)", "factorial(-4)"):
        assert thinned_call not in test
    # clamp's bounds are one line (`max(low, min(value, high))`): which argument comes back tells them apart.
    clamp = mathbits_symbol("clamp")
    answer = (
        "15, 0, 10)\nclamp(-3, 0, 10)\nclamp(5, 0, 10)\nclamp(4, 7, 7)\nclamp(20, 0, 10)\nclamp(6, 0, 10)\n"
    )
    [result] = verify_symbol_answers(mathbits_place, [clamp], [answered("oracle", clamp, 0, answer)], 1)
    [test] = result.accepted_tests
    for kept_call in ("clamp(15, 0, 10)", "clamp(-3, 0, 10)", "clamp(5, 0, 10)", "clamp(4, 7, 7)"):
        assert kept_call in test
    assert "clamp(20, 0, 10)" not in test and "clamp(6, 0, 10)" not in test


@pytest.mark.usefixtures("cpu_engine")
@pytest.mark.timeout(1800)  # 24 answers and their sandbox runs: minutes on two busy cores
def test_regression_oracles_from_the_real_server_kill_both_mutants_of_sample_functions(
    settings: Settings, mathbits_place: VerifyPlace, tmp_path: Path
) -> None:
    """On a server of its own, one request at a time: ik answers a prompt evaluated whole differently from
    one served from a slot's cache (README, table of differences), and one decoded beside another slot's
    differently from one decoded alone. On the session server the answers, and whether one of the 6 targets
    gets a test with teeth, depended on what earlier tests left in its slots; on two slots, on how the two
    requests in flight happened to overlap on the busy cores (24 of 24 samples without a test with teeth in
    one whole-suite run, passing alone). The seeded samples then get the same answers on every run.
    The targets are mathbits': on slug's and textstats' this model's only tests with teeth were of the
    TypeError of a wrong-type call (`average_word_length(1)`), which a reviewer deletes and the gate now
    refuses."""
    with private_cpu_server(settings) as server:
        _regression_oracles(server.url, settings, mathbits_place, tmp_path)


def _regression_oracles(url: str, settings: Settings, place: VerifyPlace, tmp_path: Path) -> None:
    samples = settings.pipeline.cpu_assets.samples_per_item
    config = batch_config(settings, max_slots=1)

    def send(requests: Sequence[BatchRequest]) -> BatchResult:
        # The lane's own request timeout: on busy cores one answer of 96 tokens can take minutes.
        timeout_s = settings.lanes.cpu_lane.request_timeout_s
        with (
            CpuClient(url, timeout_s=timeout_s) as client,
            ResponseCache(tmp_path / "cache.sqlite3") as cache,
        ):
            return BatchRunner(client, cache, config).run(list(requests))

    targets = [mathbits_symbol(name) for name in ("clamp", "gcd", "lcm", "digit_sum", "factorial", "mean")]
    # 96 tokens hold several one-line calls; longer answers of this model ramble (and the suite is slow).
    results, batch = run_symbol_tests(send, place, targets, MATHBITS_MAP, {}, samples, max_tokens=96)
    figures = yield_of_tests(results)
    report = {r.name: [a.status for a in r.answers] for r in results}
    assert figures.asked == 6 and figures.sampled == 6 * samples, report
    assert batch is not None and batch.summary.failed == 0
    assert figures.targets_with_accepted >= 1, json.dumps(report, indent=1)
    for result in results:
        for answer in result.answers:
            if answer.accepted:  # three mutants for a test of an exception: remove_raises too
                assert re.search(f"fails on all [23] mutants of {result.name}$", answer.reason), answer.reason
                assert "TypeError" not in (answer.test_code or "")


def test_day_work_takes_changed_symbols_then_the_backlog_across_the_sample_days(tmp_path: Path) -> None:
    history = sample_repo.history(sample_repo.FIRST_MODULES)
    commits = [build_history(tmp_path / "repo", [spec]) for spec in history]
    covered: set[str] = set()
    before: list[Symbol] = []
    picked = []
    for commit in commits:
        today = symbols_at(tmp_path / "repo", commit)
        assert set(today.test_sources) <= {"tests/test_slug.py", "tests/test_textstats.py"}
        work, targets = day_work(today, before, covered, backlog_per_day=2)
        picked.append((work.changed, [s.name for s in targets], work.remaining))
        covered |= {s.memo_key for s in targets}
        before = today.symbols
    # Day 1: no day before, so the backlog takes the most referenced first (words: called by the others),
    # ties in source order.
    assert picked[0] == ([], ["words", "word_count"], 1)
    # Day 2: the new symbols first, then what day 1 left.
    assert picked[1][0] == ["slug.py::slugify", "textstats.py::average_word_length"]
    assert picked[1][1] == ["slugify", "average_word_length", "top_words"] and picked[1][2] == 0
    # Day 3: slugify changed (a separator), unique_slug is new; nothing else is asked again.
    assert picked[2] == (["slug.py::slugify", "slug.py::unique_slug"], ["slugify", "unique_slug"], 0)
    broken = CommitSpec(
        when=datetime(2026, 11, 4, tzinfo=UTC), message="broken", files={"bad.py": "def f(:\n"}
    )
    commit = build_history(tmp_path / "repo", [broken])
    left_out = symbols_at(tmp_path / "repo", commit).left_out
    assert left_out["bad.py"].startswith("SyntaxError line 1")

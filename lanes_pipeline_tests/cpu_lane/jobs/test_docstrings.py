"""Documentation generation: the requests, answers read as docstrings, the parameter and example checks, the
docstring written into its file and the diff (`git apply --check`), training candidates; the doctest gate in
the sandbox on hand-written answers (a wrong example rejected, a right one accepted, a hang killed); and the
`generated_docs` asset against the real llama-server on a tiny repository."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from lanes_pipeline.bench.cpu_yield import docs_yield
from lanes_pipeline.cpu_lane.assets.generated_docs import doc_row, generated_docs, symbols_tested
from lanes_pipeline.cpu_lane.assets.repo_snapshot import repo_snapshot
from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest, ItemFailure, ItemResult
from lanes_pipeline.cpu_lane.batching.batch_summary import summarize
from lanes_pipeline.cpu_lane.jobs.docstring_day import (
    DOC_CHECKS,
    DocAnswer,
    DocsConfig,
    DocsDay,
    _Judged,
    _transient,
    ask_docs,
    read_probe,
    run_docs,
    verify_docs_answers,
)
from lanes_pipeline.cpu_lane.jobs.docstring_edit import DocstringError, document, set_docstring
from lanes_pipeline.cpu_lane.jobs.docstrings import (
    MAX_ROUNDS,
    answer_start,
    docs_batch,
    docs_candidates,
    example_problem,
    missing_parameters,
    needs_docstring,
    parameters,
    prefill,
    read_docstring,
    round_of,
    unsafe_examples,
)
from lanes_pipeline.cpu_lane.jobs.memo import Memo
from lanes_pipeline.cpu_lane.jobs.oracle_tests import VerifyPlace
from lanes_pipeline.cpu_lane.jobs.rows import GeneratedDocRow, GeneratedTestRow
from lanes_pipeline.cpu_lane.resources import CpuLaneResource
from lanes_pipeline.daily.partitions import daily_partitions, partitioned_daily
from lanes_pipeline.daily.resources import ArtifactStoreResource, PipelineSettingsResource
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.git import CommitSpec, build_history, ls_tree
from lanes_pipeline.repos.snapshot import FileEntry, Snapshot, language_of
from lanes_pipeline.repos.symbols import Symbol, extract_symbols
from lanes_pipeline.sandbox.isolation import CommandResult, detect_isolation
from lanes_pipeline.settings import CpuLane, SandboxLimits, Settings, load_settings
from lanes_pipeline.store import ArtifactStore
from lanes_pipeline_tests.config_files import read_config, write_config

TEXT = '''"""Small text helpers."""

import re


def shout(text: str, *, times: int = 1) -> str:
    """Old words."""
    return (text.upper() + "!") * times


def squash(text, /, sep="-", **extra):
    # spaces become one separator
    return re.sub(r"\\s+", sep, text.strip())


def one_liner(x): return x


class Counter:
    def __init__(self, start=0):
        self.value = start

    def add(self, by=1):
        self.value += by
        return self.value
'''
# The tiny repository the gate and the day run on: `shout` without its docstring, since a symbol that has
# one is never asked (an existing docstring is never replaced).
UNDOCUMENTED = TEXT.replace('    """Old words."""\n', "")
GOOD = '''Shout the text.

    Args:
        text: what to shout.
        times: how often.

    Examples:
        >>> shout("hi", times=2)
        'HI!HI!'
    """'''
WRONG = GOOD.replace("'HI!HI!'", "'hi!hi!'")
HANG = GOOD.replace('shout("hi", times=2)', "while True: shout('x', times=1)")


def symbols(source: str = TEXT, path: str = "text.py") -> dict[str, Symbol]:
    return {s.name: s for s in extract_symbols(path, source).symbols}


# ---------------------------------------------------------------------------------------------------------
# Pure
# ---------------------------------------------------------------------------------------------------------


def test_requests_keep_the_fixed_prefix_and_start_the_docstring() -> None:
    found = symbols()
    requests = docs_batch([found["shout"], found["squash"]], "repo map", samples=3)
    assert [r.id for r in requests[:3]] == [f"docs:text.py::shout#s{i}" for i in range(3)]
    assert [r.seed for r in requests[:3]] == [0, 1, 2] and all(r.temperature > 0 for r in requests)
    assert len({r.messages[0].content for r in requests}) == 1  # one system prefix: the prefix cache holds
    assert "repo map" in requests[0].messages[0].content
    # The worked example's exchange is fixed bytes too: every request shares everything up to the target.
    assert len({tuple(m.content for m in r.messages[:3]) for r in requests}) == 1
    assert [m.role for m in requests[0].messages] == ["system", "user", "assistant", "user", "assistant"]
    user = requests[0].messages[-2].content
    assert user.startswith("Write the docstring of the target.\n") and "Target: `shout`" in user
    assert "Old words." not in user  # its own docstring is not shown: written, not copied
    assert requests[0].messages[-1].role == "assistant"
    # shout's own docstring starts the answer verbatim, with a new paragraph after it: it is extended only.
    assert requests[0].messages[-1].content == answer_start(found["shout"])
    assert answer_start(found["shout"]) == prefill(found["shout"]) + "Old words.\n\n    "
    assert "Complete the docstring of `shout`" in user
    assert requests[3].messages[-1].content == prefill(found["squash"])  # squash has none: from scratch
    assert "Write the docstring of `squash`." in requests[3].messages[-2].content
    assert prefill(found["shout"]).endswith('def shout(text: str, *, times: int = 1) -> str:\n    """')
    assert prefill(found["Counter"]).endswith('class Counter:\n    """')
    assert requests[0].stop == ['"""', "```"]
    assert requests[0].varying_from == len(answer_start(found["shout"]))  # the samples share the whole prompt


def test_an_answer_reads_the_same_with_or_without_the_prefill_echoed() -> None:
    shout = symbols()["shout"]
    ik = read_docstring(shout, GOOD)  # ik_llama.cpp: the continuation only, up to the stop
    mainline = read_docstring(shout, prefill(shout) + GOOD.removesuffix('"""'))
    assert ik == mainline
    literal, value = ik
    assert literal.startswith('"""Shout the text.\n\nArgs:\n    text:') and literal.endswith('\n"""')
    assert value.splitlines()[0] == "Shout the text." and '>>> shout("hi", times=2)' in value
    assert read_docstring(shout, "Say it.")[0] == '"""Say it."""'
    assert read_docstring(shout, r"Split on \n.")[0] == r'r"""Split on \n."""'  # escapes kept as written
    with pytest.raises(DocstringError, match="not a string literal"):
        read_docstring(shout, "Ends in a backslash\\")
    for empty in ("", '   \n  """', "```"):
        with pytest.raises(DocstringError, match="empty docstring"):
            read_docstring(shout, empty)


def test_every_parameter_must_be_named_self_and_cls_excluded() -> None:
    found = symbols()
    assert parameters(found["shout"]) == ["text", "times"]
    assert parameters(found["squash"]) == ["text", "sep", "extra"]
    assert parameters(found["Counter"]) == ["start"]  # the class: its __init__, without self
    assert parameters(symbols("@dataclass\nclass P:\n    x: int\n    y: int = 0\n")["P"]) == ["x", "y"]
    assert missing_parameters(found["shout"], read_docstring(found["shout"], GOOD)[1]) == []
    assert missing_parameters(found["shout"], "Shout text, timeshare.") == ["times"]  # whole words only
    assert missing_parameters(found["squash"], "Squash text_x with sep.") == ["text", "extra"]


def test_examples_must_exist_call_the_symbol_and_stay_within_the_policy() -> None:
    shout = symbols()["shout"]
    assert example_problem(shout, read_docstring(shout, GOOD)[1]) is None
    assert example_problem(shout, "Shout text times.") == "no `>>>` example"
    assert example_problem(shout, "Shout.\n\n>>> 1 + 1\n2") == "no example uses shout"
    assert "doctest cannot read" in str(example_problem(shout, "Shout.\n\n  >>> shout('a')\n'A!'"))
    assert unsafe_examples(">>> import subprocess\n>>> shout('a')\n'A!'") != []
    assert unsafe_examples(read_docstring(shout, GOOD)[1]) == []


def changed_lines(diff: str) -> list[int]:
    """Line numbers (of the old file) each hunk touches, from the hunk headers and their -/+ lines."""
    touched, line = [], 0
    for text in diff.splitlines():
        if text.startswith("@@"):
            line = int(text.split()[1].split(",")[0].lstrip("-"))
        elif text.startswith(("---", "+++")):
            continue
        elif text.startswith("-"):
            touched.append(line)
            line += 1
        elif text.startswith("+"):
            touched.append(line)
        elif text.startswith(" "):
            line += 1
    return touched


def git_apply_check(tmp_path: Path, path: str, before: str, diff: str) -> None:
    (tmp_path / path).write_text(before, encoding="utf-8")
    (tmp_path / "change.diff").write_text(diff, encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "apply", "--check", "change.diff"], cwd=tmp_path, check=True, capture_output=True)


@pytest.mark.parametrize("name", ["shout", "squash", "Counter", "Counter.add"])
def test_the_docstring_replaces_or_joins_the_symbol_and_its_diff_applies(tmp_path: Path, name: str) -> None:
    found = symbols()
    if name == "Counter.add":  # a method of a class too large to take whole
        target = {s.name: s for s in extract_symbols("text.py", TEXT, max_class_lines=2).symbols}[name]
    else:
        target = found[name]
    literal = '"""Do it.\n\nArgs:\n    x: a thing.\n"""'
    done = document(target, TEXT, literal)
    assert done.docstring == "Do it.\n\nArgs:\n    x: a thing."
    assert done.file_source.count('"""Do it.') == 1
    assert ("Old words." in done.file_source) == (name != "shout")  # shout's own docstring is replaced
    assert all(target.start_line <= n <= target.end_line + 1 for n in changed_lines(done.diff)), done.diff
    git_apply_check(tmp_path, "text.py", TEXT, done.diff)
    assert done.symbol_source.lstrip().startswith(("def ", "class "))
    assert '"""Do it.' in done.symbol_source and done.symbol_source == done.symbol_source.lstrip("\n")
    # Removing it again gives back the undocumented file.
    bare = set_docstring(TEXT, name, None)
    assert set_docstring(done.file_source, name, None) == bare


def test_a_file_without_a_final_newline_gets_a_diff_git_applies(tmp_path: Path) -> None:
    source = "def f(a):\n    return a"
    done = document(symbols(source, "f.py")["f"], source, '"""Return a.\n\n>>> f(1)\n1\n"""')
    git_apply_check(tmp_path, "f.py", source, done.diff)
    assert done.file_source.endswith("    return a")


def test_a_body_on_the_def_line_cannot_take_a_docstring() -> None:
    with pytest.raises(DocstringError, match="its body starts on the `def`/`class` line"):
        document(symbols()["one_liner"], TEXT, '"""Same."""')


def doc_result_row(verdict: str, documented: str | None) -> GeneratedDocRow:
    return GeneratedDocRow(
        repo="r",
        path="text.py",
        module="text",
        symbol="shout",
        verdict=verdict,  # type: ignore[arg-type]
        reason="why",
        sampled=2,
        accepted_answers=1 if verdict == "accepted" else 0,
        docstring="Old words.\n\nShout `text`, `times` times over.",  # keeps the existing docstring
        documented=documented,
        diff="d",
    )


def test_candidates_are_the_accepted_rows_with_the_documented_symbol() -> None:
    rows = [doc_result_row("accepted", "def shout(text):\n    ..."), doc_result_row("fails_doctest", "x")]
    [candidate] = docs_candidates(rows, {("r", "text.py"): TEXT})
    assert candidate.task == "write_docs" and candidate.symbol == "shout" and candidate.code == TEXT
    assert candidate.answer == "```python\ndef shout(text):\n    ...\n```"
    with pytest.raises(KeyError, match=r"generated_docs row r:text\.py::shout: no source of that file"):
        docs_candidates(rows, {})


def test_an_accepted_row_the_facts_refuse_is_no_candidate() -> None:
    # An older day's row, accepted before docstring_facts: what the review branch would refuse does not train.
    row = doc_result_row("accepted", "def shout(text):\n    ...")
    replaced = row.model_copy(update={"docstring": "Shout the text."})
    phantom = row.model_copy(update={"docstring": "Old words.\n\nArgs:\n    text: t.\n    loud: l."})
    assert docs_candidates([replaced, phantom], {("r", "text.py"): TEXT}) == []


def test_a_probe_run_reads_as_passed_failed_or_killed() -> None:
    ran = CommandResult(returncode=0, timed_out=False, duration_s=0.1, output="")
    assert read_probe(ran, '{"attempted": 2, "failed": 0}') == (True, "2 examples passed")
    failed = ran.model_copy(update={"returncode": 1})
    assert read_probe(failed, '{"attempted": 2, "failed": 1, "report": "Expected: 1"}')[1].startswith(
        "failure: 1 of 2 examples failed: Expected: 1"
    )
    killed = CommandResult(returncode=None, timed_out=True, duration_s=5, output="")
    assert read_probe(killed, None) == (False, "timeout: killed at the sandbox's time limit")
    assert read_probe(failed.model_copy(update={"output": "ImportError: x"}), None)[1].startswith("crashed")
    # The sandbox failing to start is no verdict on the answer: named so, and not remembered (_transient).
    setup = failed.model_copy(update={"output": 'File "/x/sandbox_init.py", line 191, in main'})
    assert read_probe(setup, None)[1].startswith("sandbox_error: ")
    assert _transient(DocAnswer(sample=0, status="fails_doctest", reason="run 1 of 2: sandbox_error: x"))
    assert not _transient(DocAnswer(sample=0, status="fails_doctest", reason="run 1 of 2: failure: x"))
    assert not _transient(DocAnswer(sample=0, status="no_answer", reason="too_long: 9000 tokens"))


def test_the_docs_kind_of_the_yield_benchmark_counts_sampled_and_accepted_answers(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    rows = {
        "2026-11-01": [doc_result_row("accepted", "x"), doc_result_row("fails_doctest", None)],
        "2026-11-02": [doc_result_row("no_example", None)],
    }
    for day, found in rows.items():
        data = json.dumps([r.model_dump(mode="json") for r in found]).encode()
        store.write_bytes(store.folder("generated_docs", day) / "results.json", data)
    figures = docs_yield(store, list(rows)).model_dump(exclude_none=True)
    assert figures == {
        "asked": 3,
        "sampled": 6,
        "accepted": 1,
        "targets_with_accepted": 1,
        "pass_at_1": round(1 / 6, 4),
        "pass_at_n": round(1 / 3, 4),
    }


# ---------------------------------------------------------------------------------------------------------
# The gate in the sandbox, on hand-written answers
# ---------------------------------------------------------------------------------------------------------


def tiny_repo(root: Path) -> tuple[Path, str]:
    spec = CommitSpec(
        when=datetime(2026, 11, 1, 10, tzinfo=UTC), message="text", files={"text.py": UNDOCUMENTED}
    )
    return root, build_history(root, [spec])


def answered(target: Symbol, sample: int, text: str) -> ItemResult:
    return ItemResult(
        index=sample, id=f"docs:{target.id}#s{sample}", key=f"k{sample}", status="ok", text=text
    )


def test_the_sandbox_accepts_right_examples_and_rejects_wrong_or_hanging_ones(tmp_path: Path) -> None:
    repo, commit = tiny_repo(tmp_path / "repo")
    place = VerifyPlace(
        repo=repo,
        commit=commit,
        limits=SandboxLimits(timeout_s=5, memory_mb=768, runs=2),
        isolation=detect_isolation(),
    )
    shout = symbols(UNDOCUMENTED)["shout"]
    no_times = GOOD.replace("        times: how often.\n", "").replace("times=2", "").replace("HI!HI!", "HI!")
    items = [answered(shout, i, text) for i, text in enumerate([GOOD, WRONG, no_times, GOOD, HANG])]
    judge = _Judged(place)
    [result] = verify_docs_answers(judge, [shout], {"text.py": UNDOCUMENTED}, items, samples=6)
    verdicts = [(a.status, a.reason) for a in result.answers]
    assert verdicts[0] == ("accepted", "1 examples passed in 2 of 2 runs")
    assert (
        verdicts[1][0] == "fails_doctest" and "Expected:\n    'hi!hi!'\nGot:\n    'HI!HI!'" in verdicts[1][1]
    )
    assert verdicts[2] == ("missing_parameter", "does not name times")  # checked before any sandbox
    assert verdicts[3][0] == "accepted" and judge.ran == 3  # the same docstring is judged once
    assert verdicts[4] == ("fails_doctest", "run 1 of 2: timeout: killed at the sandbox's time limit")
    assert verdicts[5] == ("no_answer", "not in the batch's results")
    assert result.accepted_docs == [result.answers[0].docstring]
    assert result.tally.sampled == 6 and result.tally.accepted == 2
    row = doc_row("r", result)
    assert row.accepted and row.documented is not None and row.diff is not None
    assert row.checks == list(DOC_CHECKS)  # the accepted row says what it was checked for
    (tmp_path / "apply").mkdir()
    git_apply_check(tmp_path / "apply", "text.py", UNDOCUMENTED, row.diff)


class FakeLane:
    """Answers every docs request with `text`; records what was asked."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.asked: list[str] = []

    def __call__(self, requests: Sequence[BatchRequest]) -> BatchResult:
        items = [
            ItemResult(index=i, id=r.id, key=str(i), status="ok", text=self.text)
            for i, r in enumerate(requests)
        ]
        self.asked += [r.id for r in requests]
        return BatchResult.model_construct(results=items, summary=summarize(items, 0.1), server=None)


class RoundsLane:
    """Answers each round as a small model would: the summary alone, then the arguments, then an example."""

    ROUNDS = (
        "Shout the text.\n    ",
        " what to shout.\n        times: how often.\n    ",
        "\"hi\", times=2)\n        'HI!HI!'\n    ",
    )

    def __init__(self) -> None:
        self.asked: list[BatchRequest] = []

    def __call__(self, requests: Sequence[BatchRequest]) -> BatchResult:
        self.asked += requests
        items = [
            ItemResult(index=i, id=r.id, key=str(i), status="ok", text=self.ROUNDS[round_of(r.id)])
            for i, r in enumerate(requests)
        ]
        return BatchResult.model_construct(results=items, summary=summarize(items, 0.1), server=None)


def test_sections_an_answer_left_out_are_opened_for_it_in_further_rounds(tmp_path: Path) -> None:
    repo, commit = tiny_repo(tmp_path / "repo")
    place = VerifyPlace(
        repo=repo, commit=commit, limits=SandboxLimits(timeout_s=30, runs=1), isolation=detect_isolation()
    )
    shout, lane = symbols(UNDOCUMENTED)["shout"], RoundsLane()
    results, batches = run_docs(lane, place, [shout], "map", samples=1)
    assert [r.id for r in lane.asked] == [
        "docs:text.py::shout#s0",
        "docs:text.py::shout#s0+r1",
        "docs:text.py::shout#s0+r2",
    ] and len(batches) == 3
    second, third = (r.messages[-1].content for r in lane.asked[1:])
    assert second == prefill(shout) + "Shout the text.\n\n    Args:\n        text:"
    assert third.endswith("times: how often.\n\n    Examples:\n        >>> shout(")
    assert lane.asked[1].messages[:-1] == lane.asked[0].messages[:-1]  # the same conversation, longer start
    [answer] = results[0].answers
    assert answer.status == "accepted", answer.reason
    assert answer.docstring == read_docstring(shout, GOOD)[1]


def test_a_round_that_fails_stands_for_its_sample_unless_it_was_only_too_long() -> None:
    shout = symbols()["shout"]
    requests = docs_batch([shout], "map", samples=2)

    def send(batch: Sequence[BatchRequest]) -> BatchResult:
        items = []
        for i, r in enumerate(batch):
            if round_of(r.id) == 0:
                items.append(ItemResult(index=i, id=r.id, key=str(i), status="ok", text="Shout.\n    "))
            else:  # the second round: sample 0 meets a server error, sample 1 a prompt too long
                kind = "server_error" if r.id.startswith(requests[0].id) else "too_long"
                failure = ItemFailure(kind=kind, reason="r")  # type: ignore[arg-type]
                items.append(ItemResult(index=i, id=r.id, key=str(i), status="failed", failure=failure))
        return BatchResult.model_construct(results=items, summary=summarize(items, 0.1), server=None)

    asked = ask_docs(send, [shout], requests)
    first, second = sorted(asked.answers, key=lambda a: a.id)
    assert (first.id, first.status) == (requests[0].id, "failed") and len(asked.batches) == 2
    expected = (requests[1].id, "ok", answer_start(shout) + "Shout.\n    ")
    assert (second.id, second.status, second.text) == expected


def snapshot_of(repo: Path, commit: str) -> Snapshot:
    files = [
        FileEntry(path=e.path, blob=e.blob, language=language_of(e.path), size=e.size)
        for e in ls_tree(repo, commit)
    ]
    return Snapshot(
        repo="tiny",
        day=datetime(2026, 11, 1).date(),
        branch="HEAD",
        commit=commit,
        previous_commit=None,
        files=files,
        repo_map="map",
    )


def test_a_day_asks_the_chosen_symbols_once_and_a_rerun_asks_nothing(tmp_path: Path) -> None:
    repo, commit = tiny_repo(tmp_path / "repo")
    store = ArtifactStore(tmp_path / "artifacts")
    config = DocsConfig(model="m", samples=1, limits=SandboxLimits(timeout_s=30, runs=1))
    day = DocsDay(Memo(store, "symbol_docs"), Memo(store, "docs_register"), config, tmp_path)
    lane, isolation = FakeLane(GOOD), detect_isolation()
    chosen = ["text.py::shout", "text.py::gone", "text.py::Counter"]
    results, coverage = day.run(snapshot_of(repo, commit), repo, chosen, lane, lambda: isolation)
    assert lane.asked == ["docs:text.py::shout#s0", "docs:text.py::Counter#s0"]
    statuses = [(r.name, r.answers[0].status) for r in results]
    assert statuses == [("shout", "accepted"), ("Counter", "missing_parameter")]
    assert coverage is not None
    assert (coverage.symbols, coverage.with_accepted_docs, coverage.asked_today) == (4, 1, 2)
    assert day.verified == 1 and coverage.already_documented == 0
    assert results[0].answers[0].checks == list(DOC_CHECKS)  # an accepted answer lists every check
    lane.asked.clear()
    again, coverage_again = day.run(snapshot_of(repo, commit), repo, chosen, lane, lambda: isolation)
    assert lane.asked == [] and again == results and coverage_again == coverage and day.verified == 1


COMPLETE = '''    """Old words.

    Args:
        text: what to shout.
        times: how often.

    >>> shout("a")
    'A!'
    """
'''


def test_a_symbol_whose_docstring_has_its_sections_is_never_asked(tmp_path: Path) -> None:
    complete = TEXT.replace('    """Old words."""\n', COMPLETE)
    assert not needs_docstring(symbols(complete)["shout"]) and needs_docstring(symbols()["shout"])
    spec = CommitSpec(when=datetime(2026, 11, 1, 10, tzinfo=UTC), message="text", files={"text.py": complete})
    repo = tmp_path / "repo"
    commit = build_history(repo, [spec])
    store = ArtifactStore(tmp_path / "artifacts")
    config = DocsConfig(model="m", samples=1, limits=SandboxLimits(timeout_s=30, runs=1))
    day = DocsDay(Memo(store, "symbol_docs"), Memo(store, "docs_register"), config, tmp_path)
    lane = FakeLane(GOOD)
    results, coverage = day.run(snapshot_of(repo, commit), repo, ["text.py::shout"], lane, detect_isolation)
    assert lane.asked == [] and results == [] and day.verified == 0
    assert coverage is not None and (coverage.asked_today, coverage.already_documented) == (0, 1)


def test_a_documented_symbol_is_extended_after_its_own_words(tmp_path: Path) -> None:
    """shout's one-line docstring is kept verbatim; the answer (a continuation of it) adds Args and an
    example, and the file gets both."""
    spec = CommitSpec(when=datetime(2026, 11, 1, 10, tzinfo=UTC), message="text", files={"text.py": TEXT})
    repo = tmp_path / "repo"
    commit = build_history(repo, [spec])
    store = ArtifactStore(tmp_path / "artifacts")
    config = DocsConfig(model="m", samples=1, limits=SandboxLimits(timeout_s=30, runs=1))
    day = DocsDay(Memo(store, "symbol_docs"), Memo(store, "docs_register"), config, tmp_path)
    extension = GOOD.removeprefix("Shout the text.\n\n    ")
    lane = FakeLane(extension)
    results, coverage = day.run(snapshot_of(repo, commit), repo, ["text.py::shout"], lane, detect_isolation)
    assert coverage is not None and (coverage.asked_today, coverage.already_documented) == (1, 0)
    best = results[0].answers[0]
    assert best.accepted, best.reason
    assert best.docstring is not None and best.docstring.startswith("Old words.\n\nArgs:\n    text: what to")
    assert best.documented is not None and '"""Old words.\n\n    Args:' in best.documented


def test_generated_tests_rows_give_the_day_symbols_in_order() -> None:
    rows = [
        GeneratedTestRow(
            repo="a",
            path="m.py",
            module="m",
            test_file="t",
            code=None,
            verdict="no_calls",
            reason="r",
            symbol=name,
        )
        for name in ("g", "f")
    ]
    rows.append(rows[0].model_copy(update={"symbol": None}))
    assert symbols_tested(rows) == {"a": ["m.py::g", "m.py::f"]}


# ---------------------------------------------------------------------------------------------------------
# The asset against the real llama-server
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_generated_docs_asks_the_lane_judges_every_answer_and_a_rerun_asks_nothing(
    tmp_path: Path, settings: Settings, cpu_server: EmbeddedServer
) -> None:
    repo, _ = tiny_repo(tmp_path / "repo")
    config_dir = tmp_path / "configs"
    shutil.copytree(settings.config_dir, config_dir)
    repos = {"repos": [{"name": "tiny", "path": str(repo), "include": ["**/*.py"]}]}
    write_config(config_dir / "repos.yaml", repos)
    pipeline = read_config(config_dir / "pipeline.yaml")
    pipeline["cpu_assets"].update(
        samples_per_item=1, tests_max_tokens=64, sandbox={"timeout_s": 20, "memory_mb": 768, "runs": 1}
    )
    write_config(config_dir / "pipeline.yaml", pipeline)
    store = ArtifactStore(tmp_path / "artifacts")
    day = "2026-11-01"
    # generated_tests' choice of the day, as it would have written it (its own tests cover how it chooses).
    chosen = GeneratedTestRow(
        repo="tiny",
        path="text.py",
        module="text",
        test_file="t",
        code=None,
        verdict="no_calls",
        reason="r",
        symbol="shout",
    )
    chosen_json = json.dumps([chosen.model_dump(mode="json")])
    store.write_bytes(store.folder("generated_tests", day) / "results.json", chosen_json.encode())
    resources = {
        "cpu_lane": CpuLaneResource(
            config=CpuLane(base_url=cpu_server.url, cache_path=str(tmp_path / "c.db"))
        ),
        "artifact_store": ArtifactStoreResource(root=str(store.root)),
        "pipeline_settings": PipelineSettingsResource(config_dir=str(config_dir)),
    }
    assets = partitioned_daily([repo_snapshot, generated_docs], daily_partitions(load_settings(config_dir)))  # type: ignore[arg-type]
    instance = DagsterInstance.ephemeral()

    def run(asset: str) -> dict[str, object]:
        result = materialize(
            assets, resources=resources, partition_key=day, instance=instance, selection=[asset]
        )
        assert result.success
        [event] = result.get_asset_materialization_events()
        return {k: v.value for k, v in event.materialization.metadata.items()}

    # The snapshot first: generated_docs follows generated_tests, which is not materialized here.
    run("repo_snapshot")

    first = run("generated_docs")
    # One sample (the suite's time is tight), in up to MAX_ROUNDS rounds (one per section it left out).
    assert 1 <= first["llm_requests"] <= MAX_ROUNDS
    assert first["docs/asked"] == 1 and first["docs/sampled"] == 1
    [row] = store.read_json("generated_docs", day, "results.json")
    assert row["symbol"] == "shout" and row["sampled"] == 1
    assert row["verdict"] in {
        "accepted",
        "no_docstring",
        "not_inserted",
        "replaces_docstring",
        "missing_parameter",
        "contradicts_code",
        "no_example",
        "unsafe",
        "fails_doctest",
    }, row
    assert row["verdict"] == "accepted" or row["reason"]
    again = run("generated_docs")
    assert again["llm_requests"] == 0 and again["artifact_hash"] == first["artifact_hash"]

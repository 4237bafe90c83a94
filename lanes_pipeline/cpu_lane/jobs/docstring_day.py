"""`generated_docs`' work: docstrings with examples for the day's symbols, verified in the sandbox.

1. The symbols: the ones generated_tests took that day (its changed symbols first, then its backlog), read
   again at the day's commit (repos/scan.py), but those whose own docstring already has its sections: an
   existing docstring is never replaced, only extended after its text (docs/review.md).
2. The repository's environment (repo_env), as for generated tests: none needed without dependency files;
   when one is needed and cannot be built, the reason is recorded and no docstring is asked that day.
3. Each symbol is asked `samples` times (verified_sampling); each answer is read as a docstring
   (docstrings.py), must keep any docstring the symbol had (docstring_facts.replaced_docstring_problem),
   name every parameter, state nothing its code does not bear out (docstring_facts: Args, Raises,
   Returns, summary) and hold a `>>>` example of the symbol, and is then written
   into the symbol's file inside a sandbox at the day's commit, where its examples run as doctests with the
   repository's Python, `limits.runs` times (a different hash seed each), under the sandbox's limits (a
   hang is killed at `timeout_s`). Equal docstrings are judged once; accepted ones are kept once.
4. Results are remembered under what decides them (the symbol's memo key, the commit, the model, samples,
   tokens, sandbox limits, whether an environment was used): a re-run asks and runs nothing.

The doctest runs in the same process as the examples, so an example written to forge the verdict could;
examples that reach for processes, sockets or dynamic code are rejected before they run (as tests are).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import (
    BatchRequest,
    ItemResult,
    names_deterministic_failure,
)
from lanes_pipeline.cpu_lane.jobs.docstring_edit import DocstringError, Documented, document
from lanes_pipeline.cpu_lane.jobs.docstring_facts import (
    FACT_CHECKS,
    fact_check_results,
    replaced_docstring_problem,
)
from lanes_pipeline.cpu_lane.jobs.docstrings import (
    MAX_ROUNDS,
    DocStatus,
    continuation,
    docs_batch,
    example_problem,
    missing_parameters,
    needs_docstring,
    read_docstring,
    request_id,
    sample_of,
    unsafe_examples,
    whole_answer,
)
from lanes_pipeline.cpu_lane.jobs.memo import Memo, memo_key
from lanes_pipeline.cpu_lane.jobs.oracle_tests import VerifyPlace
from lanes_pipeline.cpu_lane.jobs.verified_sampling import DEFAULT_TEMPERATURE, TargetTally, sample_id
from lanes_pipeline.git import git
from lanes_pipeline.repos.scan import symbols_at
from lanes_pipeline.repos.snapshot import Snapshot
from lanes_pipeline.repos.symbols import Symbol
from lanes_pipeline.sandbox.host_read import UnsafeResultError, read_result_text, remove_result
from lanes_pipeline.sandbox.isolation import (
    SANDBOX_INIT,
    SETUP_FAILED,
    CommandResult,
    Isolation,
    open_sandbox,
)
from lanes_pipeline.sandbox.repo_env import dependency_files_at, ensure_env, read_dependencies
from lanes_pipeline.settings import SandboxLimits

DOCS_VERSION = 3  # bump when the prompt, the checks or the gate change: remembered results are forgotten
PROBE_PATH = ".lanes/doctest_probe.py"
RESULTS_PATH = ".lanes/doctest_results.json"
SANDBOX_ERROR = "sandbox_error"
# The verdicts reached before any sandbox (the pure checks).
NO_SANDBOX = frozenset(("no_answer", "no_docstring", "not_inserted", "replaces_docstring"))
NO_SANDBOX |= {"missing_parameter", "contradicts_code", "no_example", "unsafe"}
# What an accepted answer has passed, in the order verify_doc_answer checks it (GeneratedDocRow.checks):
# docstring_facts' checks sit between the parameter names and the examples.
DOC_CHECKS = (
    "keeps_existing_docstring",
    "names_every_parameter",
    *FACT_CHECKS,
    "example_calls_symbol",
    "examples_safe",
    "doctest_passes",
)


class DocAnswer(Frozen):
    sample: int
    status: DocStatus
    reason: str = ""
    docstring: str | None = Field(None, description="the docstring read from the answer (None: none)")
    documented: str | None = Field(None, description="the symbol's source with it in place")
    diff: str | None = None
    checks: list[str] = Field([], description="the DOC_CHECKS it passed (all of them when accepted)")

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"


class DocsResult(Frozen):
    """Every sampled answer of one symbol with its verdict, and the accepted docstrings (deduplicated)."""

    symbol_id: str
    path: str
    module: str
    name: str
    memo_key: str
    answers: list[DocAnswer]
    accepted_docs: list[str] = Field([], description="distinct accepted docstrings, first seen first")

    @property
    def tally(self) -> TargetTally:
        return TargetTally(
            target=self.symbol_id, sampled=len(self.answers), accepted=sum(a.accepted for a in self.answers)
        )


class AskedDocs(BaseModel):
    """Each sample's answer (its last round that came back, the whole start and continuation as its text),
    and every batch sent."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    answers: list[ItemResult] = []
    batches: list[BatchResult] = []


class DocsConfig(Frozen):
    model: str
    samples: int
    limits: SandboxLimits
    max_tokens: int | None = None


class DocsCoverage(Frozen):
    """One repository's coverage by accepted docstrings, after the day."""

    repo: str
    symbols: int
    with_accepted_docs: int
    asked_today: int
    already_documented: int = Field(
        0, description="the day's symbols not asked: their docstring has its Args and an example already"
    )
    environment: str = Field("", description="why no docstring was asked (no environment)")


# ---------------------------------------------------------------------------------------------------------
# The doctest probe (pure) and the gate (sandbox)
# ---------------------------------------------------------------------------------------------------------

# Runs inside the sandbox with the repository's Python: the docstring's examples, with the target module's
# globals, as `python -m doctest` runs them (no option flags). The verdict goes to a file, not stdout.
_PROBE = """\
import doctest as _doctest, importlib as _importlib, json as _json, sys as _sys

_module = _importlib.import_module({module!r})
_test = _doctest.DocTestParser().get_doctest(
    {docstring!r}, dict(vars(_module)), {name!r}, getattr(_module, "__file__", None), 0
)
_report = []
_result = _doctest.DocTestRunner(verbose=False).run(_test, out=_report.append)
with open(_sys.argv[1], "w", encoding="utf-8") as _out:
    _json.dump({{"attempted": _result.attempted, "failed": _result.failed,
                "report": "".join(_report)[-1500:]}}, _out)
_sys.exit(1 if _result.failed else 0)
"""


def probe_script(module: str, name: str, docstring: str) -> str:
    return _PROBE.format(module=module, name=f"{module}.{name}", docstring=docstring)


def read_probe(command: CommandResult, results: str | None) -> tuple[bool, str]:
    """(passed, what happened) of one probe run, from its process result and its results file."""
    if command.timed_out:
        return False, "timeout: killed at the sandbox's time limit"
    if results is None and (command.returncode == SETUP_FAILED or SANDBOX_INIT.name in command.output):
        # The sandbox itself failed before the examples ran: no verdict on the answer (not remembered).
        return False, f"{SANDBOX_ERROR}: {command.output[-400:]}"
    data = None
    if results is not None:
        try:
            data = json.loads(results)
        except ValueError:
            data = None
    if not isinstance(data, dict):
        return False, f"crashed (exit {command.returncode}): {command.output[-400:]}"
    attempted, failed = int(data.get("attempted", 0)), int(data.get("failed", 0))
    if failed or command.returncode != 0:
        return False, f"failure: {failed} of {attempted} examples failed: {data.get('report', '')}"[:600]
    if attempted == 0:
        return False, "no example ran"
    return True, f"{attempted} examples passed"


def verify_doc(place: VerifyPlace, symbol: Symbol, documented: Documented) -> tuple[DocStatus, str]:
    """The gate: the documented file in place at the commit, the examples pass `limits.runs` runs."""
    runs = place.limits.runs
    detail = ""
    with open_sandbox(place.repo, place.commit, place.limits, place.isolation) as sandbox:
        sandbox.write(symbol.path, documented.file_source)
        sandbox.write(PROBE_PATH, probe_script(symbol.module, symbol.name, documented.docstring))
        results = sandbox.worktree / RESULTS_PATH
        for index in range(runs):
            remove_result(sandbox.worktree, RESULTS_PATH)
            command = sandbox.run(
                [place.python or sys.executable, PROBE_PATH, str(results)], {"PYTHONHASHSEED": str(index)}
            )
            try:
                text = read_result_text(sandbox.worktree, RESULTS_PATH)
            except UnsafeResultError as exc:  # replaced by the code under test
                return "fails_doctest", f"run {index + 1} of {runs}: {exc}"[:600]
            passed, detail = read_probe(command, text)
            detail = detail.replace(f"{sandbox.worktree}/", "")  # the same reason from every sandbox
            if not passed:
                return "fails_doctest", f"run {index + 1} of {runs}: {detail}"[:600]
    return "accepted", f"{detail} in {runs} of {runs} runs"


class _Judged:
    """Verdicts by docstring within one run: equal answers (often, from different samples) judged once."""

    def __init__(self, place: VerifyPlace) -> None:
        self.place = place
        self.verdicts: dict[str, tuple[DocStatus, str]] = {}
        self.ran = 0

    def __call__(self, symbol: Symbol, documented: Documented) -> tuple[DocStatus, str]:
        key = hashlib.sha256(f"{symbol.id}\0{documented.literal}".encode()).hexdigest()
        if key not in self.verdicts:
            self.ran += 1
            self.verdicts[key] = verify_doc(self.place, symbol, documented)
        return self.verdicts[key]


Judge = Callable[[Symbol, Documented], tuple[DocStatus, str]]


def verify_doc_answer(judge: Judge, symbol: Symbol, file_source: str, sample: int, text: str) -> DocAnswer:
    """One answer, read as a docstring, checked, and (when it passes the checks) put through the gate."""
    try:
        literal, value = read_docstring(symbol, text)
    except DocstringError as exc:
        return DocAnswer(sample=sample, status="no_docstring", reason=str(exc)[:600])
    try:
        documented = document(symbol, file_source, literal)
    except (DocstringError, SyntaxError) as exc:
        return DocAnswer(sample=sample, status="not_inserted", reason=str(exc)[:600], docstring=value)
    common = {
        "sample": sample,
        "docstring": value,
        "documented": documented.symbol_source,
        "diff": documented.diff,
    }
    passed: list[str] = []
    # The cheap, pure checks first, in DOC_CHECKS' order: only an answer that passes them all is worth a
    # sandbox; each refusal keeps the checks passed before it.
    replaced = replaced_docstring_problem(file_source, symbol.name, value)
    if replaced is not None:
        return DocAnswer(status="replaces_docstring", reason=replaced[:600], **common)
    passed.append("keeps_existing_docstring")
    missing = missing_parameters(symbol, value)
    if missing:
        reason = f"does not name {', '.join(missing)}"
        return DocAnswer(status="missing_parameter", reason=reason, checks=passed, **common)
    passed.append("names_every_parameter")
    facts = fact_check_results(file_source, symbol.name, value)
    problems = [p for found in facts.values() for p in found]
    if problems:
        reason = "; ".join(problems)[:600]
        passed += [c for c in FACT_CHECKS if not facts[c]]
        return DocAnswer(status="contradicts_code", reason=reason, checks=passed, **common)
    passed += FACT_CHECKS
    problem = example_problem(symbol, value)
    if problem is not None:
        return DocAnswer(status="no_example", reason=problem, checks=passed, **common)
    passed.append("example_calls_symbol")
    unsafe = unsafe_examples(value)
    if unsafe:
        return DocAnswer(status="unsafe", reason=", ".join(unsafe)[:600], checks=passed, **common)
    passed.append("examples_safe")
    status, reason = judge(symbol, documented)
    if status == "accepted":
        passed.append("doctest_passes")
    return DocAnswer(status=status, reason=reason, checks=passed, **common)


def _no_answer(sample: int, item: ItemResult | None) -> DocAnswer:
    if item is None:
        reason = "not in the batch's results"
    else:
        reason = f"{item.failure.kind}: {item.failure.reason}" if item.failure else "no text"
    return DocAnswer(sample=sample, status="no_answer", reason=reason[:600])


def file_sources(repo: Path, commit: str, paths: Sequence[str]) -> dict[str, str]:
    """The files at the commit (git objects, no checkout)."""
    return {p: git(repo, "show", f"{commit}:{p}").decode("utf-8") for p in sorted(set(paths))}


def verify_docs_answers(
    judge: Judge,
    symbols: Sequence[Symbol],
    sources: dict[str, str],
    items: Sequence[ItemResult],
    samples: int,
) -> list[DocsResult]:
    """Verify each answer of `items` (the batch's results for `docs_batch`); keep each symbol's accepted
    docstrings once. A sample missing from `items` or failed counts as sampled and not accepted."""
    by_id = {item.id: item for item in items}
    results = []
    for symbol in symbols:
        answers = []
        for index in range(samples):
            item = by_id.get(sample_id(request_id(symbol), index))
            if item is None or item.status != "ok" or item.text is None:
                answers.append(_no_answer(index, item))
                continue
            answers.append(verify_doc_answer(judge, symbol, sources[symbol.path], index, item.text))
        kept: list[str] = []
        for answer in answers:
            if answer.accepted and answer.docstring is not None and answer.docstring not in kept:
                kept.append(answer.docstring)
        results.append(
            DocsResult(
                symbol_id=symbol.id,
                path=symbol.path,
                module=symbol.module,
                name=symbol.name,
                memo_key=symbol.memo_key,
                answers=answers,
                accepted_docs=kept,
            )
        )
    return results


# ---------------------------------------------------------------------------------------------------------
# The day (I/O: git, memo, lane, sandbox)
# ---------------------------------------------------------------------------------------------------------

Send = Callable[[Sequence[BatchRequest]], BatchResult]


def repo_python(repo: Path, commit: str, data_dir: Path) -> tuple[str | None, str]:
    """(the interpreter examples run with, '' or why none could be built), as generated tests have it."""
    files = dependency_files_at(repo, commit)
    if not files:
        return None, ""  # nothing to install: the project's own Python runs them
    env = ensure_env(read_dependencies(files), data_dir)
    if not env.ok:
        return None, f"the repository's environment could not be built: {env.reason} (log {env.log_path})"
    return env.python, ""


class DocsDay:
    """The memo namespaces of the job, and the batches it sent (for the metadata)."""

    def __init__(self, results: Memo, register: Memo, config: DocsConfig, data_dir: Path) -> None:
        self.results, self.register, self.config, self.data_dir = results, register, config, data_dir
        self.batches: list[BatchResult] = []
        self.asked = 0
        self.verified = 0  # docstrings this run took into a sandbox (remembered results need none)

    def run(
        self,
        snapshot: Snapshot,
        repo: Path,
        symbol_ids: Sequence[str],
        send: Send,
        isolation: Callable[[], Isolation],
    ) -> tuple[list[DocsResult], DocsCoverage | None]:
        """Docstrings for `symbol_ids` (generated_tests' symbols of the day, in its order)."""
        if snapshot.commit is None:
            return [], None
        paths = snapshot.code_paths()
        today = symbols_at(repo, snapshot.commit, paths)
        by_id = today.by_id()
        chosen = [by_id[i] for i in dict.fromkeys(symbol_ids) if i in by_id]
        # Chosen here, before any request: a symbol whose docstring already has its sections is not asked.
        targets = [s for s in chosen if needs_docstring(s)]
        register_key = memo_key("docs_register", DOCS_VERSION, snapshot.repo)
        accepted = set((self.register.get(register_key) or {"accepted": []})["accepted"])
        python, reason = repo_python(repo, snapshot.commit, self.data_dir) if targets else (None, "")
        results: list[DocsResult] = []
        if targets and not reason:
            place = VerifyPlace(
                repo=repo,
                commit=snapshot.commit,
                limits=self.config.limits,
                python=python,
                isolation=isolation(),
            )
            results = self._results(place, targets, snapshot.repo_map, send)
            found = {r.symbol_id for r in results if r.accepted_docs}
            if not found <= accepted:
                accepted |= found
                self.register.put(register_key, {"accepted": sorted(accepted)})
        coverage = DocsCoverage(
            repo=snapshot.repo,
            symbols=len(today.symbols),
            with_accepted_docs=sum(s.id in accepted for s in today.symbols),
            asked_today=len(targets),
            already_documented=len(chosen) - len(targets),
            environment=reason,
        )
        return results, coverage

    def _key(self, symbol: Symbol, place: VerifyPlace) -> str:
        config = self.config
        asked = (config.model, config.samples, config.max_tokens, config.limits.model_dump())
        return memo_key(
            "symbol_docs", DOCS_VERSION, symbol.memo_key, place.commit, *asked, place.python is not None
        )

    def _results(
        self, place: VerifyPlace, targets: Sequence[Symbol], repo_map: str, send: Send
    ) -> list[DocsResult]:
        keys = {s.id: self._key(s, place) for s in targets}
        known = {i: self.results.get(k) for i, k in keys.items()}
        missing = [s for s in targets if known[s.id] is None]
        if missing:
            found, batches = run_docs(
                send, place, missing, repo_map, self.config.samples, self.config.max_tokens
            )
            self.batches += batches
            self.asked += sum(len(b.results) for b in batches)
            self.verified += sum(a.status not in NO_SANDBOX for r in found for a in r.answers)
            for result in found:
                # A transient failure (the lane's, or the sandbox's own) is not remembered: the next run
                # asks that symbol again.
                if not any(_transient(a) for a in result.answers):
                    self.results.put(keys[result.symbol_id], result.model_dump(mode="json"))
                known[result.symbol_id] = result.model_dump(mode="json")
        return [DocsResult.model_validate(known[s.id]) for s in targets]


def _transient(answer: DocAnswer) -> bool:
    if answer.status == "no_answer":
        return not names_deterministic_failure(answer.reason)
    return answer.status == "fails_doctest" and f": {SANDBOX_ERROR}: " in answer.reason


def ask_docs(send: Send, symbols: Sequence[Symbol], requests: Sequence[BatchRequest]) -> AskedDocs:
    """Send the first round, then up to MAX_ROUNDS - 1 rounds for the answers that still lack a section
    (docstrings.continuation); each sample's answer is its last round that came back."""
    symbol_of = {request_id(s): s for s in symbols}  # a sample's id is `<request_id>#s<i>`
    batches: list[BatchResult] = []
    answers: dict[str, ItemResult] = {}
    pending = list(requests)
    for _ in range(MAX_ROUNDS):
        if not pending:
            break
        batch = send(pending)
        batches.append(batch)
        follow = []
        for request, item in zip(pending, batch.results, strict=True):
            sample = sample_of(request.id)
            if item.status != "ok" or item.text is None:
                # A round too long for the slot keeps the answer so far; any other failure stands for the
                # sample (not remembered, asked again next run; the rounds before come from the cache).
                if sample not in answers or item.failure is None or item.failure.kind != "too_long":
                    answers[sample] = item.model_copy(update={"id": sample})
                continue
            whole = whole_answer(request, item.text)
            answers[sample] = item.model_copy(update={"id": sample, "text": whole})
            after = continuation(request, symbol_of[sample.rsplit("#s", 1)[0]], whole)
            if after is not None:
                follow.append(after)
        pending = follow
    return AskedDocs(answers=list(answers.values()), batches=batches)


def run_docs(
    send: Send,
    place: VerifyPlace,
    symbols: Sequence[Symbol],
    shared_context: str,
    samples: int,
    max_tokens: int | None = None,
    temperature: float = DEFAULT_TEMPERATURE,
) -> tuple[list[DocsResult], list[BatchResult]]:
    """Ask `samples` docstrings per symbol (in rounds, see ask_docs) and verify them; the batches come back
    too, for their figures (none: nothing asked)."""
    requests = docs_batch(symbols, shared_context, samples, max_tokens, temperature)
    asked = ask_docs(send, symbols, requests) if requests else AskedDocs()
    sources = file_sources(place.repo, place.commit, [s.path for s in symbols])
    return verify_docs_answers(_Judged(place), symbols, sources, asked.answers, samples), asked.batches

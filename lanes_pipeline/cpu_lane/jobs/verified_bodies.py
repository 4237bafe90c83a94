"""Verified bodies, rejection sampling as in ReST-EM: the CPU lane writes the day's functions again and only
the bodies their tests pass become "write the body" rows.

For each function of the day's selection that is not held out and has tests (the repository's own that call
it, and the day's accepted generated tests for it), the lane is asked `samples` times, at a temperature above
zero, exactly the request the GPU lane's held-out repository tasks send (`body_messages`). Each answer's
function runs in the sandbox in place of the real one (dataset/body_check.py, the judge's own check), and is
accepted when every test that passes on the real code passes with it. A target is only sampled for if some
test passes on the real code and one of those fails on the function gutted (`gutted`: the body replaced by
`raise NotImplementedError`): tests that pass either way would accept any body. Bodies equal to the real
one, or to an earlier sample, once docstrings and layout are set aside (`normal_form`), are not run again.
The real body is kept too (`verdict` "real").

Pure except `judge_target`, which runs the sandbox.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field

from lanes_pipeline.config.base import Frozen
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest
from lanes_pipeline.cpu_lane.jobs.verified_sampling import samples_of
from lanes_pipeline.dataset.body_check import function_sandbox, replacement
from lanes_pipeline.dataset.contract import user_prompt
from lanes_pipeline.dataset.holdout_rules import HeldOutFunction, body_request, is_held_out, judged_function
from lanes_pipeline.http import ChatMessage
from lanes_pipeline.repos.symbols import Symbol
from lanes_pipeline.sandbox.isolation import Isolation
from lanes_pipeline.sandbox.python_source import parse_python
from lanes_pipeline.sandbox.safety import redacted
from lanes_pipeline.settings import SandboxLimits

REQUEST_FAILED = "the request failed"  # a sample the lane never answered: not counted as sampled
BODIES_VERSION = 1  # bump when the check changes in a way that should forget remembered verdicts

Verdict = Literal["real", "accepted", "no_def", "duplicate", "failed", "no_report", "untestable"]


class SampledBody(Frozen):
    """One body of a target and its verdict: a result row of the `verified_bodies` asset."""

    repo: str
    path: str
    symbol: str = Field(description="the function's name")
    symbol_id: str
    request: str = Field(description="the code the request shows (body_request): the row's user message")
    sample: int | None = Field(description="the sample's seed; None for the real body")
    verdict: Verdict
    reason: str = ""
    body: str | None = Field(None, description="the function's source, for 'real' and 'accepted'")
    tests: int = Field(0, ge=0, description="tests that judged it (those passing on the real code)")

    @property
    def trains(self) -> bool:
        return self.verdict in ("real", "accepted") and self.body is not None


def body_targets(
    repo: str,
    location: Path,
    commit: str,
    symbols: Sequence[Symbol],
    test_sources: Mapping[str, str],
    accepted_tests: Mapping[str, list[str]],
    held_out_percent: int,
) -> list[HeldOutFunction]:
    """The day's top-level functions that are not held out and that some test judges (the repository's own
    that call it, the day's accepted generated tests for it), each with those tests. Never a held-out one:
    its body is what the judge asks for."""
    found = []
    for symbol in symbols:
        if symbol.kind != "function" or is_held_out(repo, symbol.id, held_out_percent):
            continue
        function = judged_function(repo, str(location), commit, symbol, test_sources, accepted_tests)
        if function.repo_tests or function.cpu_tests:
            found.append(function)
    return found


def body_messages(function: HeldOutFunction, system_prompt: str) -> list[ChatMessage]:
    """The GPU lane's held-out repository task (gpu_lane/repo_tasks.body_task), word for word."""
    symbol = function.symbol
    # Repository text: its secret values redacted, as every CPU-lane prompt's (prompts.PromptLayout).
    prompt = redacted(user_prompt("write_body", symbol.path, body_request(symbol), symbol.name))
    return [ChatMessage(role="system", content=system_prompt), ChatMessage(role="user", content=prompt)]


def body_requests(
    function: HeldOutFunction, system_prompt: str, samples: int, temperature: float, max_tokens: int
) -> list[BatchRequest]:
    request = BatchRequest(
        id=f"{function.repo}:{function.symbol.id}",
        messages=body_messages(function, system_prompt),
        max_tokens=max_tokens,
    )
    return samples_of(request, samples, temperature)


def gutted(source: str) -> str:
    """The function with its body replaced by `raise NotImplementedError` (decorators, signature and
    docstring kept): what its tests must fail on."""
    tree = parse_python(source)
    function = tree.body[0]
    if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
        raise ValueError(f"not a function: {source.splitlines()[0] if source else '(empty)'}")
    docstring = function.body[:1] if ast.get_docstring(function) is not None else []
    function.body = [*docstring, ast.Raise(exc=ast.Name(id="NotImplementedError", ctx=ast.Load()))]
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def normal_form(source: str) -> str:
    """The function's code without its docstring, comments or layout: two bodies that differ only there are
    the same body."""
    tree = parse_python(source)
    for node in ast.walk(tree):
        documented = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if documented and ast.get_docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def judge_target(
    function: HeldOutFunction,
    answers: Sequence[tuple[int, str | None]],
    limits: SandboxLimits,
    isolation: Isolation | None = None,
) -> list[SampledBody]:
    """The real body's row and one row per answer (sample seed, text; None for a request that failed) for
    one target, checked in one sandbox at its commit."""
    symbol = function.symbol
    judges: list[str] = []  # the tests that pass on the real code: those that judge a body

    def row(sample: int | None, verdict: Verdict, reason: str = "", body: str | None = None) -> SampledBody:
        return SampledBody(
            repo=function.repo,
            path=symbol.path,
            symbol=symbol.name,
            symbol_id=symbol.id,
            request=body_request(symbol),
            sample=sample,
            verdict=verdict,
            reason=reason,
            body=body,
            tests=len(judges),
        )

    real_source = symbol.source.rstrip() + "\n"
    with function_sandbox(function, limits, isolation) as box:
        real = box.outcomes(None)
        judges = sorted(node for node, outcome in real.items() if outcome == "passed")
        problem = _untestable(real, judges, box.outcomes(gutted(real_source)) if judges else {})
        if problem is not None:
            return [row(None, "untestable", problem), *(row(i, "untestable", problem) for i, _ in answers)]
        rows = [row(None, "real", f"{len(judges)} test(s) passed", real_source)]
        seen = {normal_form(real_source): "the same body as the real one"}
        for sample, text in answers:
            new_source = replacement(text, symbol.name) if text is not None else None
            if new_source is None:
                reason = REQUEST_FAILED if text is None else f"no parseable `def {symbol.name}`"
                rows.append(row(sample, "no_def", reason))
                continue
            form = normal_form(new_source)
            if form in seen:
                rows.append(row(sample, "duplicate", seen[form]))
                continue
            seen[form] = f"the same body as sample {sample}"
            outcomes = box.outcomes(new_source)
            failed = [node for node in judges if outcomes.get(node) != "passed"]
            if not outcomes:
                rows.append(row(sample, "no_report", "the tests did not run (import error or timeout)"))
            elif failed:
                rows.append(row(sample, "failed", f"{len(failed)} test(s) failed: {failed[0]}"))
            else:
                rows.append(row(sample, "accepted", f"{len(judges)} test(s) passed", new_source))
    return rows


def _untestable(real: dict[str, str], judges: list[str], gutted_outcomes: dict[str, str]) -> str | None:
    """Why a target's tests cannot tell a right body from a wrong one; None when they can. Only the tests
    that pass on the real code judge (`judges`), as for the held-out tasks."""
    if not real:
        return "its tests gave no report on the real code"
    if not judges:
        return f"none of its {len(real)} test(s) pass on the real code"
    if gutted_outcomes and all(gutted_outcomes.get(node) == "passed" for node in judges):
        return "its tests pass with the body gutted: they would accept any body"
    return None

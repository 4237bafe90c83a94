"""Held-out symbols: a stable share of each repository's top-level functions and classes, chosen by hash,
that the LoRA never trains on. The CPU lane still works on them (their accepted tests judge answers), but
their rows go to the eval split only, their bodies are masked out of every training row's code, and they
become the GPU lane's repository tasks (`HeldOutFunction`, written by lora_dataset, read by
adapter_evaluation). The functions that are not held out teach that same task: a "write_body" row shows
what the repository task shows (body_request) and answers with the user's own function. Everything here is
pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from lanes_pipeline.dataset.writer import Candidate
from lanes_pipeline.repos.scan import body_statements, body_text, function_stub, normalized_lines
from lanes_pipeline.repos.symbols import (
    Symbol,
    diff_scans,
    names_in,
    parse_symbol,
    statement_start,
    test_functions,
)

MIN_BODY_CHARS = 12  # a body shorter than this ("return x") is too common to call a leak when seen elsewhere


class HeldOutFunction(BaseModel):
    """A function and what judging a body of it needs: the repository at the day's commit, the function,
    the repository's own tests that call it, and the CPU lane's accepted tests. A held-out one is a GPU-lane
    repository task; the CPU lane's verified bodies judge its samples of a taught one the same way."""

    model_config = ConfigDict(frozen=True)

    repo: str
    location: str = Field(description="the git repository on this machine")
    commit: str
    symbol: Symbol
    stub: str = Field(description="signature and docstring: what an editor sends when a body is wanted")
    repo_tests: list[str] = Field([], description="node ids of the repository's tests that call it")
    cpu_tests: list[str] = Field([], description="accepted test modules the CPU lane wrote for it")


def body_request(symbol: Symbol) -> str:
    """What an editor sends when the user asks for a function's body: the context (imports, what it calls,
    as signatures and docstrings), then the function's own signature and docstring. Both the repository
    task (held out) and the training row (not held out) show exactly this."""
    context = symbol.context_text()
    own = function_stub(symbol)
    return f"{context}\n\n\n{own}" if context else own


def body_candidate(repo: str, symbol: Symbol) -> Candidate:
    """A "write the body" row: the request an editor sends, answered with the user's own function."""
    return Candidate(
        task="write_body",
        repo=repo,
        path=symbol.path,
        code=body_request(symbol),
        answer=f"```python\n{symbol.source.rstrip()}\n```",
        symbol=symbol.name,
        code_is_file=False,
    )


def symbol_with_context(symbol: Symbol) -> str:
    """A symbol as a per-symbol question shows it: its context, then its source."""
    context = symbol.context_text()
    return f"{context}\n\n\n{symbol.source.rstrip()}" if context else symbol.source.rstrip()


def fresh_functions(before: Sequence[Symbol], today: Sequence[Symbol]) -> list[Symbol]:
    """Today's top-level functions that are new or changed since `before` (all of them on a first day,
    when `before` is empty): the day's "write the body" rows. Unchanged ones were taught on their day and
    stay in the replay window."""
    diff = diff_scans(before, today)
    fresh = {*diff.new, *diff.changed}
    return [s for s in today if s.kind == "function" and s.id in fresh]


def held_out_key(repo: str, symbol_id: str) -> str:
    """A method is held out with its class: the key is the top-level name (`path::C` for `path::C.m`)."""
    path, name = symbol_id.split("::", 1)
    return f"{repo}:{path}::{name.split('.', 1)[0]}"


def is_held_out(repo: str, symbol_id: str, percent: int) -> bool:
    digest = hashlib.sha256(held_out_key(repo, symbol_id).encode()).hexdigest()
    return int(digest[:8], 16) % 100 < percent


def held_out_symbols(repo: str, symbols: Iterable[Symbol], percent: int) -> list[Symbol]:
    return [s for s in symbols if is_held_out(repo, s.id, percent)]


def leaked(text: str, bodies: Sequence[str]) -> bool:
    """Whether `text` holds one of the held-out `bodies` (as body_text returns them), whole."""
    haystack = "\n".join(normalized_lines(text))
    return any(len(body) >= MIN_BODY_CHARS and body in haystack for body in bodies)


def mask(source: str, held_out: Sequence[Symbol]) -> str:
    """The module with each held-out symbol's body replaced by `...` (signature and docstring stay), so a
    training row may show the file without teaching the held-out code."""
    lines = source.splitlines(keepends=True)
    for symbol in sorted(held_out, key=lambda s: s.start_line, reverse=True):
        parsed = parse_symbol(symbol)
        body = body_statements(parsed.node)
        if not body:
            continue
        start = statement_start(body[0])  # a decorated nested definition: its first decorator
        first = symbol.start_line + start - 2  # 0-based line in the file
        line = lines[first]
        head = line[: parsed.file_column(start, body[0].col_offset)]
        if head.strip():  # `def f(x): return x`, or `"""doc"""; x = 1`: the body starts mid-line
            lines[first : symbol.end_line] = [f"{head}...  # held out\n"]
        else:  # the body's own indentation as written (spaces or tabs)
            lines[first : symbol.end_line] = [f"{line[: len(line) - len(line.lstrip())]}...  # held out\n"]
    return "".join(lines)


def calling_tests(test_sources: Mapping[str, str], name: str) -> list[str]:
    """Node ids (`path::test_fn`) of the top-level test functions that name `name`."""
    return [
        f"{path}::{node.name}"
        for path, source in sorted(test_sources.items())
        for _, node in test_functions(path, source)
        if name in names_in(node)
    ]


def judged_function(
    repo: str,
    location: str,
    commit: str,
    symbol: Symbol,
    test_sources: Mapping[str, str],
    accepted: Mapping[str, list[str]],
) -> HeldOutFunction:
    """A function with the tests that judge a body of it: the repository's tests that call it and the CPU
    lane's accepted test modules for it (a held-out one's are the GPU lane's task; a taught one's judge the
    CPU lane's verified bodies)."""
    return HeldOutFunction(
        repo=repo,
        location=location,
        commit=commit,
        symbol=symbol,
        stub=function_stub(symbol),
        repo_tests=calling_tests(test_sources, symbol.name),
        cpu_tests=list(accepted.get(symbol.name, [])),
    )


def route(
    candidate: Candidate, held_out: Sequence[Symbol], unmaskable: Collection[str] = frozenset()
) -> Candidate:
    """A candidate with its split decided: about a held-out symbol of its repository (its own symbol, or
    an answer that holds a held-out body, such as a diff) -> eval, unchanged; otherwise training, with the
    held-out bodies of its file masked out of the code it shows. A file in `unmaskable` holds a held-out
    symbol that was skipped (`symbol_problem`): its body cannot be masked, so nothing of that file trains."""
    if candidate.path in unmaskable:
        return candidate.model_copy(update={"held_out": True})
    by_name = {s.name for s in held_out if s.path == candidate.path}
    if candidate.symbol is not None and candidate.symbol.split(".", 1)[0] in {
        n.split(".", 1)[0] for n in by_name
    }:
        return candidate.model_copy(update={"held_out": True})
    if leaked(candidate.answer, [body_text(s) for s in held_out]):
        return candidate.model_copy(update={"held_out": True})
    if not candidate.code_is_file:
        return candidate.model_copy(update={"held_out": False})  # signatures and docstrings: nothing to mask
    in_file = [s for s in held_out if s.path == candidate.path]
    return candidate.model_copy(update={"held_out": False, "code": mask(candidate.code, in_file)})

"""Every pure function that reads a symbol, over every symbol of real packages nobody here wrote (issue 24).

The sample repository has top-level functions and small classes only, so nothing met a method's indented
source until a real library's first day crashed in `lora_dataset`. Here each symbol of four real sdists
(real_code/: methods of classes over 120 lines, a decorated class nested in a class, async methods,
properties, metaclasses, one-line bodies) goes through extraction, the body text, the masking of held-out
bodies, the body request, the leak check, the mutants, the docstring edit and the prompts. A function may
refuse a symbol with its own typed error where the caller turns that into a verdict (a class without a
method has no mutant; a body on the `def` line has no line for a docstring): those are counted, and
anything else raised is a failure, named by symbol.
"""

from __future__ import annotations

import ast
from collections import Counter

import pytest

from lanes_pipeline.cpu_lane.jobs.docstring_edit import DocstringError, document
from lanes_pipeline.cpu_lane.jobs.docstrings import docs_prompt, parameters, prefill, undocumented_source
from lanes_pipeline.cpu_lane.jobs.mutants import MutationError, mutants
from lanes_pipeline.cpu_lane.jobs.tasks import symbol_defines, symbol_prompt
from lanes_pipeline.dataset.holdout_rules import MIN_BODY_CHARS, body_request, leaked, mask
from lanes_pipeline.repos.scan import body_text, symbol_problem
from lanes_pipeline.repos.symbols import Symbol, all_symbols, parse_symbol, scan_repo
from lanes_pipeline_tests.cpu_lane.real_code import PACKAGES, package_sources

LITERAL = '"""Return what the caller asked for.\n\nSecond paragraph, indented as the body."""'


def _without(source: str, symbol: Symbol) -> str:
    lines = source.splitlines(keepends=True)
    return "".join(lines[: symbol.start_line - 1] + lines[symbol.end_line :])


def _check_symbol(symbol: Symbol, file_source: str, refused: Counter[str]) -> None:
    node = parse_symbol(symbol).node
    assert node.name == symbol.name.rsplit(".", 1)[-1]
    assert symbol_problem(symbol) is None
    body = body_text(symbol)
    if len(body) >= MIN_BODY_CHARS:
        assert leaked(file_source, [body]), "the leak check does not find the body in its own file"
    if symbol.kind == "function":
        assert f"def {symbol.name}(" in body_request(symbol)
    assert symbol_prompt(symbol) and symbol.name.rsplit(".", 1)[-1] in symbol_defines(symbol)
    parameters(symbol)
    assert prefill(symbol).startswith("```python\n")
    assert symbol.name in docs_prompt(symbol)
    ast.parse(undocumented_source(symbol))
    try:
        found = mutants(file_source, symbol.name)
        # `return None` may equal the code (a property that returns None); raising never does.
        assert found[0].kind == "raise_not_implemented" and found[0].source != file_source
    except MutationError as exc:
        assert "has no method to mutate" in str(exc), str(exc)
        refused["mutants: a class without methods"] += 1
    try:
        documented = document(symbol, file_source, LITERAL)
        ast.parse(documented.file_source)
        assert documented.diff.startswith(f"--- a/{symbol.path}")
    except DocstringError as exc:
        assert "starts on the `def`/`class` line" in str(exc) or "shares the docstring's line" in str(exc)
        refused["docstring: no line of its own"] += 1


@pytest.mark.parametrize("package", PACKAGES)
def test_every_symbol_of_a_real_package_goes_through_every_pure_function(package: str) -> None:
    sources = package_sources(package)
    scans = scan_repo(sources)
    assert [s.path for s in scans if s.error] == []
    symbols = all_symbols(scans)
    assert len(symbols) >= 10, f"{package}: {len(symbols)} symbols"
    failures: list[str] = []
    refused: Counter[str] = Counter()
    for symbol in symbols:
        try:
            _check_symbol(symbol, sources[symbol.path], refused)
        except Exception as exc:  # every failure at once, named, rather than the first
            failures.append(f"{symbol.id}: {type(exc).__name__}: {exc}")
    assert failures == [], f"{package}: {len(failures)} of {len(symbols)} symbols failed"
    # Masking: every held-out body at once, and each alone, leaves a module that parses and no longer holds
    # that body (unless the same lines stand elsewhere in the file too).
    for path, source in sources.items():
        own = [s for s in symbols if s.path == path]
        ast.parse(mask(source, own), filename=path)
        for symbol in own:
            masked = mask(source, [symbol])
            ast.parse(masked, filename=f"{path} masked for {symbol.name}")
            body = body_text(symbol)
            if len(body) >= MIN_BODY_CHARS and not leaked(_without(source, symbol), [body]):
                assert not leaked(masked, [body]), f"{symbol.id}: its body is still in the masked file"


def test_the_real_packages_hold_what_the_pipeline_met_on_a_real_library() -> None:
    """The shapes above are really there: methods, async ones, a decorated nested class, properties."""
    kinds: Counter[str] = Counter()
    shapes: Counter[str] = Counter()
    for package in PACKAGES:
        for symbol in all_symbols(scan_repo(package_sources(package))):
            kinds[symbol.kind] += 1
            node = parse_symbol(symbol).node
            if parse_symbol(symbol).indent:
                shapes["indented source"] += 1
            for child in ast.walk(node):
                if isinstance(child, ast.AsyncFunctionDef):
                    shapes["async"] += 1
                if isinstance(child, ast.ClassDef) and child is not node and child.decorator_list:
                    shapes["decorated nested class"] += 1
                decorators = getattr(child, "decorator_list", [])
                if any(isinstance(d, ast.Name) and d.id == "property" for d in decorators):
                    shapes["property"] += 1
    assert kinds["method"] >= 20 and kinds["class"] >= 10 and kinds["function"] >= 20, kinds
    assert all(shapes[s] for s in ("indented source", "async", "decorated nested class", "property")), shapes

"""Whether a CPU-lane analysis says something about its symbol: the checks an analysis passes before it is
accepted (and may become an "explain" training row). Pure.

The grammar only proves the answer's shape. A small model fills that shape with text that reads like an
explanation and is not one: loops ("the more you learn about the more you learn about"), runs of digits,
a summary cut off at the length limit, chat addressed to the user ("Please help me to complete it."),
claims the code contradicts ("not implemented" of a function with a body), or a summary about nothing in
the code. Each check below fails on one of those; the labelled fixture of real analyses
(analysis_labels.json) measures how often an accepted analysis is still nonsense (`gate_precision`).
"""

from __future__ import annotations

import ast
import builtins
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from lanes_pipeline.cpu_lane.jobs.docstring_facts import (
    ANY_EXCEPTION,
    exception_ancestors,
    is_generator,
    raisable,
    returns_value,
    signature_parameters,
)
from lanes_pipeline.cpu_lane.jobs.tasks import FileAnalysis, symbol_defines
from lanes_pipeline.repos.symbols import Symbol, SymbolSourceError, definition, names_in
from lanes_pipeline.sandbox.safety import injection_markers

# Real analyses, each labelled by a person `sound` or `nonsense` (tools/collect_analyses.py collects them).
LABELS_FILE = Path(__file__).with_name("analysis_labels.json")
# Below this share of sound analyses among the accepted ones, explanations stay out of the training rows.
MIN_PRECISION = 0.9
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_WORD = re.compile(r"[a-z0-9]+")
_CHAR_RUN = re.compile(r"(.)\1{5,}")  # "1000000000", "!!!!!!": a model stuck on one token
# A summary ends a sentence; the grammar's length limit cuts one off without.
_SENTENCE_END = re.compile(r"""[.!?)"'`\]]\s*$""")
# Words the model writes to the user instead of about the code.
_CHAT = re.compile(
    r"\b(please|help me|i am|i'm|i cannot|i can't|sorry|as an ai|let me|puzzle|not sure|"
    r"the code is (?:a bit|not clear|unclear|confusing|incomplete|missing))\b",
    re.IGNORECASE,
)
# Claims that there is no code to speak of: false for a symbol with a real body.
_NO_BODY = re.compile(
    r"\b(not (?:yet )?implemented|unimplemented|incomplete|placeholder|does nothing|not available|"
    r"no code|empty (?:function|method|class|body)|stub)\b",
    re.IGNORECASE,
)
_REPEATED_NGRAM = 4  # the same 4 words twice in one text is a loop, not an explanation
# Words that say nothing about which code a summary is about.
_STOP_WORDS = """
the a an and or of to in on for with by is are be it its this that these those as at from into which when
if not no but than then there their them they returns return value values given function method class code
file module object objects python data used using uses use does do
"""
_STOP = frozenset(_STOP_WORDS.split())
# What an analysis writes as code: `name`, `name(...)`, name() (a dotted name: its last part).
_CODE_NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)(?:\(|`)|\b([A-Za-z_][A-Za-z0-9_.]*)\(\)")
_RAISES_CLAIM = re.compile(
    r"\b(?:raises|raising|throws|raise|throw)\s+(?:an?\s+)?`?([A-Z][A-Za-z0-9_]*(?:Error|Exception|Exit|Warning))"
)
_NO_RETURN_CLAIM = re.compile(
    r"\b(?:returns (?:None|nothing)|does not return|doesn't return)\b", re.IGNORECASE
)
_RETURN_CLAIM = re.compile(r"\b(?:returns|return value)\b", re.IGNORECASE)
_CALLS_CLAIM = re.compile(r"\bcalls\s+`?([A-Za-z_][A-Za-z0-9_.]*)")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _stem(word: str) -> str:
    """Crude stem so "formats"/"formatting"/"format" and "rows"/"row" meet."""
    return word[:5] if len(word) > 5 else word.rstrip("s")


def _identifier_parts(name: str) -> Iterable[str]:
    for part in re.split(r"[_.]|(?<=[a-z0-9])(?=[A-Z])", name):
        if len(part) >= 3:
            yield part.lower()


def symbol_vocabulary(symbol: Symbol) -> set[str]:
    """Stems of what the symbol's code is made of: the names it defines, reads and takes, the attributes
    it touches, and the words of its docstrings and string constants."""
    words: list[str] = list(_identifier_parts(symbol.name))
    try:
        tree = definition(symbol)
    except SymbolSourceError:
        return {_stem(w) for w in [*words, *_words(symbol.source)] if len(w) >= 3}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            words += _identifier_parts(node.name)
        elif isinstance(node, ast.Name):
            words += _identifier_parts(node.id)
        elif isinstance(node, ast.Attribute):
            words += _identifier_parts(node.attr)
        elif isinstance(node, ast.arg):
            words += _identifier_parts(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words += [w for w in _words(node.value) if len(w) >= 3]
    return {_stem(w) for w in words if w not in _STOP}


def has_real_body(symbol: Symbol) -> bool:
    """Whether the symbol does something: more than a docstring, `pass`, `...` or raising
    NotImplementedError (for a class: any method that does)."""
    try:
        tree = definition(symbol)
    except SymbolSourceError:
        return True
    bodies = [tree.body] if not isinstance(tree, ast.ClassDef) else []
    bodies += [n.body for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return any(_does_something(body) for body in bodies) or (
        isinstance(tree, ast.ClassDef) and not bodies and len(tree.body) > 1
    )


def _does_something(body: list[ast.stmt]) -> bool:
    for statement in body:
        if isinstance(statement, ast.Pass):
            continue
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring or `...`
        if isinstance(statement, ast.Raise) and "NotImplementedError" in ast.unparse(statement):
            continue
        return True
    return False


def _called_names(node: ast.AST) -> set[str]:
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Call):
            func = child.func
            found.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return found


def claim_problem(analysis: FileAnalysis, symbol: Symbol) -> str | None:
    """Why the analysis says something of `symbol` its code contradicts (None: nothing found), where the
    code can tell: a name written as code (`name`, name()) that neither the symbol's code, its module's
    imports nor Python's builtins have; in the summary, an exception said to be raised that the code cannot
    raise (docstring_facts.raisable; lenient when a function it calls may, as its documented callees say),
    a value said to be returned by code that returns none (or none said of code that returns one), a
    function said to be called that the code never calls."""
    try:
        node = definition(symbol)
    except SymbolSourceError:
        return None
    known = names_in(node) | symbol_defines(symbol) | set(dir(builtins))
    known |= set(signature_parameters(node) or []) | {"self", "cls"}
    known |= set(_words(" ".join(symbol.imports))) | set(" ".join(symbol.imports).replace(",", " ").split())
    callees = " ".join(symbol.callees)
    for text in (analysis.summary, *analysis.risks, *analysis.test_ideas):
        for match in _CODE_NAME.finditer(text):
            name = (match.group(1) or match.group(2)).split(".")[-1]
            if name and name not in known and name not in callees:
                return f"names `{name}`, which is not in the code of {symbol.name}"
    summary = analysis.summary
    tree = ast.Module(body=[node], type_ignores=[])
    raised = raisable(tree, node)
    reachable = set().union(*(exception_ancestors(r, tree) for r in raised)) if raised else set()
    for match in _RAISES_CLAIM.finditer(summary):
        name = match.group(1)
        if ANY_EXCEPTION not in raised and name not in reachable and name not in callees:
            return f"says {name} is raised, which {symbol.name} never raises"
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not is_generator(node):
        gives = returns_value(node)
        if gives and _NO_RETURN_CLAIM.search(summary):
            return f"says {symbol.name} returns nothing, but it returns a value"
        if not gives and not _NO_RETURN_CLAIM.search(summary) and _RETURN_CLAIM.search(summary):
            return f"says {symbol.name} returns a value, but it returns none"
    called = _called_names(node)
    for match in _CALLS_CLAIM.finditer(summary):
        name = match.group(1).split(".")[-1]
        if name in known and name not in called and name not in callees:
            return f"says {symbol.name} calls `{name}`, which it never calls"
    return None


def degenerate(text: str) -> str | None:
    """Why a text is a loop rather than prose (None: it is not)."""
    run = _CHAR_RUN.search(text)
    if run:
        return f"a run of {run.group(1)!r} ({run.group(0)[:12]}...)"
    words = _words(text)
    grams = Counter(tuple(words[i : i + _REPEATED_NGRAM]) for i in range(len(words) - _REPEATED_NGRAM + 1))
    repeated = [gram for gram, n in grams.items() if n > 1]
    if repeated:
        return f"repeats {' '.join(repeated[0])!r}"
    return None


def analysis_problem(analysis: FileAnalysis, symbol: Symbol) -> str | None:
    """Why a parsed analysis of `symbol` is not accepted (None: accepted): a real summary that ends its
    sentence, names something of the symbol's code and does not talk to the user or claim there is no
    code when there is; no text looping; no item repeated; every public API entry naming something the
    symbol defines; no prompt-injection text; no claim the code contradicts (claim_problem)."""
    summary = analysis.summary.strip()
    items = [*analysis.public_api, *analysis.risks, *analysis.test_ideas]
    if len(summary.split()) < 3:
        return "summary too short to explain anything"
    for text in (summary, *items):
        loop = degenerate(text)
        if loop:
            return f"degenerate text: {loop}"
    if not _SENTENCE_END.search(summary):
        return "summary cut off mid-sentence"
    chat = _CHAT.search(" ".join([summary, *items]))
    if chat:
        return f"talks to the user, not about the code ({chat.group(0)!r})"
    claim = _NO_BODY.search(" ".join([summary, *analysis.risks]))
    if claim and has_real_body(symbol):
        return f"claims {claim.group(0)!r} of code that has a body"
    named = {_stem(w) for w in _words(summary) if w not in _STOP and len(w) >= 3}
    if not named & symbol_vocabulary(symbol):
        return "summary names nothing of the symbol's code"
    for field in ("public_api", "risks", "test_ideas"):
        values = [item.strip().lower() for item in getattr(analysis, field)]
        if len(set(values)) < len(values):
            return f"{field} repeats itself"
    defined = symbol_defines(symbol)
    for entry in analysis.public_api:
        match = _NAME.match(entry.strip().strip("`"))
        name = match.group(0).split(".")[-1] if match else ""
        if name not in defined:
            return f"public_api names {entry.strip()[:60]!r}, which the file does not define"
    if injection_markers(" ".join([summary, *items])):
        return "answer contains prompt-injection text"
    claim = claim_problem(analysis, symbol)
    if claim:
        return f"contradicts the code: {claim}"
    return None


class LabelledAnalysis(BaseModel):
    """One entry of analysis_labels.json: a real analysis of a real symbol and a person's verdict."""

    id: str
    symbol: Symbol
    analysis: FileAnalysis
    label: Literal["sound", "nonsense"]
    why: str = ""


class GatePrecision(BaseModel):
    """How the checks do on the labelled analyses: of those they accept, the share that is sound."""

    labelled: int
    nonsense: int = Field(description="labelled nonsense")
    accepted: int = Field(description="accepted by analysis_problem")
    sound_accepted: int
    precision: float | None = Field(description="sound_accepted / accepted (None: nothing accepted)")
    nonsense_caught: float | None = Field(description="share of the nonsense the checks reject")
    explanations_trained: bool = Field(description=f"precision >= {MIN_PRECISION}: explanations may train")


def load_labels(path: Path = LABELS_FILE) -> list[LabelledAnalysis]:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the labelled analyses: {exc}") from exc
    labelled = []
    for index, entry in enumerate(entries):
        try:
            labelled.append(LabelledAnalysis.model_validate(entry))
        except ValidationError as exc:
            raise ValueError(f"{path}: entry {index} ({entry.get('id', '?')}): {exc}") from exc
    return labelled


def gate_precision(labelled: Sequence[LabelledAnalysis]) -> GatePrecision:
    """The checks re-applied to every labelled analysis (so a change to a check moves the figure)."""
    accepted = [entry for entry in labelled if analysis_problem(entry.analysis, entry.symbol) is None]
    sound_accepted = sum(entry.label == "sound" for entry in accepted)
    nonsense = sum(entry.label == "nonsense" for entry in labelled)
    precision = round(sound_accepted / len(accepted), 4) if accepted else None
    caught = nonsense - sum(entry.label == "nonsense" for entry in accepted)
    return GatePrecision(
        labelled=len(labelled),
        nonsense=nonsense,
        accepted=len(accepted),
        sound_accepted=sound_accepted,
        precision=precision,
        nonsense_caught=round(caught / nonsense, 4) if nonsense else None,
        explanations_trained=precision is not None and precision >= MIN_PRECISION,
    )

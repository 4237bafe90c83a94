"""The bounded GBNF grammar of a structured task: generated from its pydantic model, bounded by the model's
own limits, and small enough that its longest answer fits the task's max_tokens."""

from __future__ import annotations

import json
import re
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest
from lanes_pipeline.cpu_lane.batching.grammar import (
    RESERVED_TOKENS,
    ChoiceShape,
    ListShape,
    ObjectShape,
    ScalarShape,
    Shape,
    StrShape,
    fitted_shape,
    grammar_for,
    longest,
    object_shape,
)
from lanes_pipeline.cpu_lane.jobs.prompts import SHORT_ANSWER, ShortAnswer
from lanes_pipeline.cpu_lane.jobs.tasks import ANALYSIS, FileAnalysis
from lanes_pipeline.http import ChatMessage

_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z0-9-]+|\{\d+,\d+\}|[()?|])')


def gbnf_regex(grammar: str) -> re.Pattern[str]:
    """The generated grammar as a Python regex (it is regular: no rule refers to itself), to check answers
    against it without a server."""
    rules = dict(line.split(" ::= ", 1) for line in grammar.strip().splitlines())

    def convert(name: str) -> str:
        out, body = [], rules[name]
        for token in _TOKEN.findall(body):
            if token.startswith('"'):
                out.append(re.escape(json.loads(token)))
            elif token.startswith("[") or token.startswith("{") or token in "?|":
                out.append(token)
            elif token == "(":
                out.append("(?:")
            elif token == ")":
                out.append(")")
            else:
                out.append(f"(?:{convert(token)})")
        return "".join(out)

    return re.compile(convert("root"))


def longest_answer(shape: Shape) -> object:
    """An answer with every bound at its maximum: the longest text the grammar allows."""
    if isinstance(shape, StrShape):
        return "x" * shape.max_chars
    if isinstance(shape, ChoiceShape):
        return max(shape.values, key=len)
    if isinstance(shape, ScalarShape):
        return -(10**8) if shape.kind == "int" else False
    if isinstance(shape, ListShape):
        return [longest_answer(shape.item) for _ in range(shape.max_items)]
    return {name: longest_answer(field) for name, field in shape.fields}


def compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize("max_tokens", [128, 256, 320, 512, 1024, 4096])
def test_the_longest_answer_fits_max_tokens_matches_the_grammar_and_parses(max_tokens: int) -> None:
    shape = fitted_shape(FileAnalysis, max_tokens)
    answer = compact(longest_answer(shape))
    assert len(answer) == longest(shape) <= max_tokens - RESERVED_TOKENS
    assert gbnf_regex(grammar_for(FileAnalysis, max_tokens)).fullmatch(answer)
    FileAnalysis.model_validate_json(answer)  # what the grammar allows, the model accepts


def test_bounds_stay_within_the_models_own_and_lists_keep_items_of_useful_length() -> None:
    full = object_shape(FileAnalysis)
    assert full.fields[0] == ("summary", StrShape(1, 400))
    assert full.fields[1][1] == ListShape(StrShape(0, 200), 0, 8)  # unbounded items get a default
    assert full.fields[4] == ("complexity", ChoiceShape(("low", "medium", "high")))
    fitted = dict(fitted_shape(FileAnalysis, ANALYSIS.max_tokens).fields)
    summary, public_api = fitted["summary"], fitted["public_api"]
    assert isinstance(summary, StrShape) and isinstance(public_api, ListShape)
    assert 1 == summary.min_chars <= 40 <= summary.max_chars <= 400
    assert 1 <= public_api.max_items <= 8 and isinstance(public_api.item, StrShape)
    assert public_api.item.max_chars >= 28  # a name or a short phrase
    roomy = dict(fitted_shape(FileAnalysis, 100_000).fields)
    assert roomy["summary"] == StrShape(1, 400) and roomy["public_api"] == ListShape(StrShape(0, 200), 0, 8)


def test_the_grammar_rejects_what_the_model_rejects_and_json_a_loop_cannot_finish() -> None:
    pattern = gbnf_regex(grammar_for(FileAnalysis, 256))
    good = {
        "summary": "Parses numbers.",
        "public_api": ["parse"],
        "risks": [],
        "test_ideas": [],
        "complexity": "low",
    }
    assert pattern.fullmatch(compact(good))
    bad = [
        {**good, "summary": ""},  # min_length 1
        {**good, "summary": "1.1." * 100},  # the loop seen on ik: cut by the bound
        {**good, "complexity": "extreme"},
        {**good, "summary": 'says "hi"'},  # no escapes: every token adds a character
        {k: v for k, v in good.items() if k != "risks"},  # every field, in order
    ]
    for value in bad:
        assert not pattern.fullmatch(compact(value)), value
    assert not pattern.fullmatch(json.dumps(good))  # no free whitespace either


class Inner(BaseModel):
    flag: bool
    count: int
    tag: Literal["a", "b"] | None = None


class Outer(BaseModel):
    name: str = Field(min_length=2, max_length=10)
    inner: Inner
    tags: list[str] = Field(min_length=1, max_length=3)


def test_nested_models_optional_literals_and_minimum_list_lengths() -> None:
    shape = fitted_shape(Outer, 4096)
    assert shape.fields[1][1] == ObjectShape(
        "Inner",
        (("flag", ScalarShape("bool")), ("count", ScalarShape("int")), ("tag", ChoiceShape(("a", "b")))),
    )
    pattern = gbnf_regex(grammar_for(Outer, 4096))
    value = {"name": "ab", "inner": {"flag": True, "count": -12, "tag": "b"}, "tags": ["x"]}
    assert pattern.fullmatch(compact(value))
    assert not pattern.fullmatch(compact({**value, "tags": []}))  # min_length 1
    assert not pattern.fullmatch(compact({**value, "name": "a"}))
    Outer.model_validate_json(compact(longest_answer(shape)))


class Unsupported(BaseModel):
    ratio: float


def test_a_type_without_a_grammar_and_a_budget_too_small_are_named() -> None:
    with pytest.raises(TypeError, match=r"Unsupported\.ratio: type <class 'float'> has no grammar"):
        grammar_for(Unsupported, 256)
    with pytest.raises(ValueError, match=r"FileAnalysis cannot fit max_tokens=64: .* needs \d+ characters"):
        grammar_for(FileAnalysis, 64)


def test_a_task_request_sends_the_grammar_a_bare_schema_its_response_format() -> None:
    task_request = BatchRequest(
        id="q",
        messages=[ChatMessage(role="user", content="hi")],
        json_schema=SHORT_ANSWER.json_schema(),
        output_model=ShortAnswer,
        max_tokens=100,
    )
    payload = task_request.chat_request("m").payload()
    assert payload["grammar"] == grammar_for(ShortAnswer, 100) and "response_format" not in payload
    assert task_request.chat_request("m", max_tokens=200).payload()["grammar"] == grammar_for(
        ShortAnswer, 200
    )
    bare = task_request.model_copy(update={"output_model": None}).chat_request("m").payload()
    assert bare["response_format"]["json_schema"]["schema"] == SHORT_ANSWER.json_schema()
    assert "grammar" not in bare
    tiny = task_request.model_copy(update={"max_tokens": 4}).chat_request("m").payload()
    assert "grammar" not in tiny and "response_format" in tiny  # no bounded answer fits: the schema


class Huge(BaseModel):
    text: str = Field(max_length=50_000)
    items: list[int] = Field(max_length=10_000)


def test_no_repetition_bound_exceeds_what_the_servers_parse() -> None:
    """Above 2000 the servers' grammar parser refuses the bound and drops the grammar without an error."""
    grammar = grammar_for(Huge, 1_000_000)
    bounds = [int(high) for high in re.findall(r"\{\d+,(\d+)\}", grammar)]
    assert bounds and max(bounds) <= 2000

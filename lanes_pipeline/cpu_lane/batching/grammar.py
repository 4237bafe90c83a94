"""A GBNF grammar for a task's pydantic output model, bounded so that the whole answer fits its max_tokens.

Why not the JSON schema: ik_llama.cpp's server turns `response_format` into a grammar too, but the schema's
bounds (a 400-character summary, 8 list items of any length) allow answers far longer than the token budget,
and a small model that loops inside a string ("1.1.2.1.1...") runs into max_tokens with unterminated JSON.
The grammar below bounds every string with a `{m,n}` repetition of a character class and every list with a
bounded repetition, fields in the model's order, no free whitespace. Its characters are printable ASCII
without `"` and `\\` (no escapes), so every token the server may sample adds at least one character: the
longest answer the grammar allows, in characters, bounds its length in tokens. The bounds are the model's
own (`max_length`, `min_length`, Literal choices), scaled down together until that longest answer fits the
budget. Both ik_llama.cpp and upstream llama-server enforce a `grammar` field on /v1/chat/completions.

Pure: no I/O.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from dataclasses import dataclass, replace
from typing import Any, Literal, Union

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

# One character inside a JSON string: printable ASCII except the quote and the backslash.
CHAR_CLASS = r"[\x20-\x21\x23-\x5B\x5D-\x7E]"
# Bounds for what the model leaves unbounded, before scaling.
DEFAULT_MAX_CHARS = 200
DEFAULT_MAX_ITEMS = 8
INT_DIGITS = 9
# llama.cpp's grammar parser (ik's too) refuses a repetition bound above 2000, and a grammar it cannot parse
# is dropped without an error: the answer comes back unconstrained.
MAX_REPETITION = 2000
# Tokens the answer must leave free: the end-of-sequence token, and one so that a complete answer never
# reaches max_tokens (which the client reads as truncated).
RESERVED_TOKENS = 2
SCALE_STEP = 0.97
# The string length a list item should keep before lists lose items: a name or a short phrase.
USEFUL_CHARS = 28
MIN_SCALE = 1e-3


@dataclass(frozen=True)
class StrShape:
    min_chars: int
    max_chars: int


@dataclass(frozen=True)
class ChoiceShape:
    values: tuple[str, ...]


@dataclass(frozen=True)
class ScalarShape:
    kind: Literal["int", "bool"]


@dataclass(frozen=True)
class ListShape:
    item: Shape
    min_items: int
    max_items: int


@dataclass(frozen=True)
class ObjectShape:
    name: str
    fields: tuple[tuple[str, Shape], ...]


Shape = StrShape | ChoiceShape | ScalarShape | ListShape | ObjectShape


def _bounds(info: FieldInfo | None) -> tuple[int | None, int | None]:
    low = high = None
    for meta in info.metadata if info is not None else ():
        if isinstance(meta, annotated_types.MinLen):
            low = meta.min_length
        elif isinstance(meta, annotated_types.MaxLen):
            high = meta.max_length
    return low, high


def shape_of(annotation: Any, info: FieldInfo | None, where: str) -> Shape:
    """The shape of one field's type; `where` (model.field) names it in the error for an unsupported type."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(options) != 1:
            raise TypeError(f"{where}: a union of several types has no grammar here ({annotation})")
        return shape_of(options[0], info, where)
    if origin is Literal:
        values = typing.get_args(annotation)
        if not all(isinstance(v, str) for v in values):
            raise TypeError(f"{where}: only Literal strings have a grammar here ({annotation})")
        return ChoiceShape(tuple(values))
    low, high = _bounds(info)
    if annotation is str:
        chars = high if high is not None else DEFAULT_MAX_CHARS
        return StrShape(min(low or 0, MAX_REPETITION), min(chars, MAX_REPETITION))
    if annotation is bool:
        return ScalarShape("bool")
    if annotation is int:
        return ScalarShape("int")
    if origin is list:
        (item_type,) = typing.get_args(annotation) or (str,)
        item = shape_of(item_type, None, f"{where}[]")
        items = high if high is not None else DEFAULT_MAX_ITEMS
        return ListShape(item, min(low or 0, MAX_REPETITION), min(items, MAX_REPETITION))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return object_shape(annotation)
    raise TypeError(
        f"{where}: type {annotation!r} has no grammar here (str, int, bool, Literal, list, model)"
    )


def object_shape(model: type[BaseModel]) -> ObjectShape:
    hints = typing.get_type_hints(model)
    fields = tuple(
        (name, shape_of(hints[name], info, f"{model.__name__}.{name}"))
        for name, info in model.model_fields.items()
    )
    return ObjectShape(model.__name__, fields)


def longest(shape: Shape) -> int:
    """The most characters an answer of this shape can have."""
    if isinstance(shape, StrShape):
        return shape.max_chars + 2
    if isinstance(shape, ChoiceShape):
        return max(len(v) for v in shape.values) + 2
    if isinstance(shape, ScalarShape):
        return INT_DIGITS + 1 if shape.kind == "int" else len("false")
    if isinstance(shape, ListShape):
        return 2 + shape.max_items * longest(shape.item) + max(0, shape.max_items - 1)
    keys = sum(len(name) + 3 for name, _ in shape.fields)  # "name":
    return 2 + keys + sum(longest(field) for _, field in shape.fields) + max(0, len(shape.fields) - 1)


def scaled(shape: Shape, items: float, chars: float) -> Shape:
    """Bounds scaled down, never below the model's minimums: list lengths by `items`, string lengths by
    `chars` (both in (0, 1]); a list that may have items keeps at least one."""
    if isinstance(shape, StrShape):
        return replace(shape, max_chars=max(shape.min_chars, math.floor(shape.max_chars * chars)))
    if isinstance(shape, ListShape):
        count = max(shape.min_items, min(shape.max_items, 1), math.floor(shape.max_items * items))
        return replace(shape, item=scaled(shape.item, items, chars), max_items=count)
    if isinstance(shape, ObjectShape):
        fields = tuple((name, scaled(field, items, chars)) for name, field in shape.fields)
        return replace(shape, fields=fields)
    return shape


def _strings(shape: Shape) -> list[StrShape]:
    if isinstance(shape, StrShape):
        return [shape]
    if isinstance(shape, ListShape):
        return _strings(shape.item)
    if isinstance(shape, ObjectShape):
        return [s for _, field in shape.fields for s in _strings(field)]
    return []


def _longest_chars_scale(shape: Shape, items: float, budget: int) -> float | None:
    """The largest string scale (to 1e-3) whose longest answer fits `budget`, with list scale `items`."""
    if longest(scaled(shape, items, 1.0)) <= budget:
        return 1.0
    low, high = 0.0, 1.0
    if longest(scaled(shape, items, low)) > budget:
        return None
    while high - low > 1e-3:
        middle = (low + high) / 2
        low, high = (middle, high) if longest(scaled(shape, items, middle)) <= budget else (low, middle)
    return low


@functools.lru_cache(maxsize=256)
def fitted_shape(model: type[BaseModel], max_tokens: int) -> ObjectShape:
    """The model's shape with its bounds scaled down until its longest answer fits `max_tokens`.

    Lists lose items before strings fall under USEFUL_CHARS (a name or a short phrase): the first list
    scale, from 1 down, at which every string can keep that much wins; if none can, the fewest items and
    the longest strings that fit."""
    shape, budget = object_shape(model), max_tokens - RESERVED_TOKENS
    originals = _strings(shape)
    items, fallback = 1.0, None
    while items >= MIN_SCALE:
        chars = _longest_chars_scale(shape, items, budget)
        if chars is not None:
            candidate = scaled(shape, items, chars)
            fallback = candidate
            bounds = zip(originals, _strings(candidate), strict=True)
            if all(new.max_chars >= min(old.max_chars, USEFUL_CHARS) for old, new in bounds):
                break
        items *= SCALE_STEP
    if fallback is None:
        smallest = longest(scaled(shape, 0.0, 0.0))
        raise ValueError(
            f"{model.__name__} cannot fit max_tokens={max_tokens}: its shortest bounded answer needs "
            f"{smallest} characters (+{RESERVED_TOKENS} reserved tokens)"
        )
    assert isinstance(fallback, ObjectShape)
    return fallback


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _repeat(rule: str, low: int, high: int) -> str:
    return f"{rule}{{{low},{high}}}" if high > 0 else ""


class _Rules:
    def __init__(self) -> None:
        self.rules: dict[str, str] = {}

    def add(self, name: str, body: str) -> str:
        existing = self.rules.get(name)
        if existing is not None and existing != body:
            return self.add(name + "-x", body)
        self.rules[name] = body
        return name

    def value(self, shape: Shape, name: str) -> str:
        if isinstance(shape, StrShape):
            inner = _repeat("char", shape.min_chars, shape.max_chars)
            return self.add(name, f'"\\"" {inner} "\\""'.replace("  ", " "))
        if isinstance(shape, ChoiceShape):
            return self.add(name, " | ".join(_literal(f'"{v}"') for v in shape.values))
        if isinstance(shape, ScalarShape):
            body = f'"-"? [0-9]{{1,{INT_DIGITS}}}' if shape.kind == "int" else '"true" | "false"'
            return self.add(name, body)
        if isinstance(shape, ListShape):
            item = self.value(shape.item, f"{name}-item")
            if shape.max_items == 0:
                return self.add(name, '"[" "]"')
            more = _repeat(f'("," {item})', max(0, shape.min_items - 1), shape.max_items - 1)
            items = f"{item} {more}".strip()
            body = f'"[" {items} "]"' if shape.min_items > 0 else f'"[" ({items})? "]"'
            return self.add(name, body)
        parts = []
        for field, sub in shape.fields:
            key = _literal('"' + field + '":')
            parts.append(f"{key} {self.value(sub, name + '-' + field.replace('_', '-'))}")
        return self.add(name, '"{" ' + ' "," '.join(parts) + ' "}"')


def gbnf(shape: ObjectShape) -> str:
    """GBNF text for an object shape: a rule per field (a list's item too), `root`, the character class."""
    rules = _Rules()
    rules.value(shape, "root")
    rules.add("char", CHAR_CLASS)
    return "\n".join(f"{name} ::= {body}" for name, body in rules.rules.items()) + "\n"


@functools.lru_cache(maxsize=256)
def grammar_for(model: type[BaseModel], max_tokens: int) -> str:
    """The grammar a request for `model`'s JSON sends, its whole answer bounded by `max_tokens`."""
    return gbnf(fitted_shape(model, max_tokens))

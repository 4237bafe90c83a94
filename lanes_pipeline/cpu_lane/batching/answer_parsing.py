"""Reading a structured answer (JSON in whatever wrapping a small model adds) and the one repair prompt
for an answer that does not parse or does not match its schema. Pure: no I/O."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest
from lanes_pipeline.http import ChatMessage


class ParseOutcome(BaseModel):
    ok: bool
    value: Any = None
    error: str = ""


def extract_json(text: str) -> Any:
    """The JSON value in an answer: tolerates code fences and prose around one object or array."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0].strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as first_error:
        decoder = json.JSONDecoder()
        for start, char in enumerate(stripped):
            if char in "{[":
                try:
                    return decoder.raw_decode(stripped, start)[0]
                except json.JSONDecodeError:
                    continue
        raise first_error


def parse_structured(text: str, output_model: type[BaseModel] | None) -> ParseOutcome:
    """Parse an answer that should match a schema; never raises, says why it failed."""
    if not text.strip():
        return ParseOutcome(ok=False, error="empty answer")
    try:
        value = extract_json(text)
    except json.JSONDecodeError as exc:
        return ParseOutcome(ok=False, error=f"not valid JSON: {exc.msg} at char {exc.pos}")
    if output_model is None:
        return ParseOutcome(ok=True, value=value)
    try:
        return ParseOutcome(ok=True, value=output_model.model_validate(value).model_dump(mode="json"))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors())
        return ParseOutcome(ok=False, error=f"does not match the schema: {problems}")


REPAIR_PROMPT = (
    "Your previous reply could not be used: {error}. Reply again with only one JSON object that matches "
    "the schema, and nothing else."
)


def repair_request(request: BatchRequest, bad_text: str, error: str, truncated: bool) -> BatchRequest:
    """The one repair attempt: the original conversation (its prefix stays cached), the bad answer, and
    what was wrong; twice the token budget when the first answer ran out of tokens."""
    messages = [
        *request.messages,
        ChatMessage(role="assistant", content=bad_text),
        ChatMessage(role="user", content=REPAIR_PROMPT.format(error=error)),
    ]
    max_tokens = request.max_tokens * 2 if truncated else request.max_tokens
    return request.model_copy(update={"messages": messages, "max_tokens": max_tokens, "varying_from": None})

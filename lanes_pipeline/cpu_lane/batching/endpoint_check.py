"""Is this endpoint a llama-server? What `lanes config check` asks of each of `cpu_lane.endpoints`.

A llama-server is recognised the way the batch reads it (client.py: `server_info`, `per_slot_context`):
`/props` reports `total_slots`, or `/slots` lists the slots. Something else that answers HTTP there (a web
server, vLLM, a typo'd port of another service) is reported, since a batch would fail on it at once. An
endpoint that does not answer at all is only noted: a server may be down while the config is checked, and
a batch fails over from it.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
from pydantic import BaseModel, ValidationError

from lanes_pipeline.cpu_lane.batching.client import ServerProps, SlotState
from lanes_pipeline.errors import LaneUnreachableError
from lanes_pipeline.http import OpenAIClient
from lanes_pipeline.settings import RetryPolicy

Verdict = Literal["llama-server", "unreachable", "not a llama-server", "refused the key"]


class EndpointVerdict(BaseModel):
    url: str
    verdict: Verdict
    detail: str


def _json(response: httpx.Response | None) -> Any:
    if response is None:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _has_slots(props: Any, slots: Any) -> bool:
    try:
        if isinstance(props, dict) and ServerProps.model_validate(props).total_slots:
            return True
    except ValidationError:
        pass
    try:
        return isinstance(slots, list) and bool(slots) and all(SlotState.model_validate(s) for s in slots)
    except ValidationError:
        return False


def judge_answers(url: str, props: tuple[int, Any], slots: tuple[int, Any] | None) -> EndpointVerdict:
    """The verdict from what /props and /slots answered: (status, parsed JSON or None) each; `slots` None
    when it was not asked (a /props with slots is enough). Pure."""
    props_status, props_body = props
    statuses = [props_status] + ([slots[0]] if slots is not None else [])
    if any(status in (401, 403) for status in statuses):
        return EndpointVerdict(
            url=url,
            verdict="refused the key",
            detail=f"{url} refused the API key (HTTP {props_status} on GET /props): check the endpoint's "
            "api_key_env and the server's --api-key",
        )
    if props_status == 200 and _has_slots(props_body, None):
        return EndpointVerdict(url=url, verdict="llama-server", detail=f"{url} is a llama-server")
    if slots is not None and slots[0] == 200 and _has_slots(None, slots[1]):
        return EndpointVerdict(url=url, verdict="llama-server", detail=f"{url} is a llama-server")
    slots_said = f", GET /slots answered HTTP {slots[0]}" if slots is not None else ""
    props_said = "without total_slots" if props_status == 200 else f"HTTP {props_status}"
    return EndpointVerdict(
        url=url,
        verdict="not a llama-server",
        detail=f"{url} answers, but is not a llama-server: GET /props answered {props_said}{slots_said} "
        "(a llama-server reports its slots in /props or /slots)",
    )


def check_endpoint(url: str, api_key: str | None, timeout_s: float = 5.0) -> EndpointVerdict:
    """Ask the endpoint once (no retries, short timeouts): is it a llama-server?"""
    client = OpenAIClient(
        "CPU",
        url,
        api_key,
        timeout_s=timeout_s,
        connect_timeout_s=timeout_s,
        retry=RetryPolicy(max_attempts=1),
    )
    with client:
        try:
            props = client.request("GET", "/props", retries=False)
            props_answer = (props.status_code, _json(props))
            if props.status_code == 200 and _has_slots(props_answer[1], None):
                return judge_answers(url, props_answer, None)
            slots = client.request("GET", "/slots", retries=False)
            return judge_answers(url, props_answer, (slots.status_code, _json(slots)))
        except LaneUnreachableError as exc:
            return EndpointVerdict(url=url, verdict="unreachable", detail=str(exc))

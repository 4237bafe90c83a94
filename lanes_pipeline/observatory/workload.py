"""The fixed workload both lanes are measured on: the same prompts every day, so a figure that moves means
the server, the flags or the machine changed, not the questions.

Everything here is pure: prompts and request bodies. Sizes are small by default (two busy cores must run a
trial in well under a minute); a workstation raises them in `Workload(...)` for steadier figures.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SYSTEM = (
    "You are the code assistant of a repository. Answer in one short paragraph. The repository map follows; "
    "refer to files by their path."
)
# Shared context that every prefix-phase request repeats first: what a prefix cache should reuse.
REPO_MAP = "\n".join(
    f"src/pkg_{i}/module_{i}.py: def load_{i}(path), def save_{i}(path, data), class Store{i}(cache, ttl)"
    for i in range(8)
)
QUESTIONS = (
    "What does load_1 probably return?",
    "Which module would hold a retry helper?",
    "Name a function that writes data.",
    "What could Store3's ttl mean?",
    "Which file would you test first, and why?",
    "Suggest a better name for save_5.",
    "What does the cache argument suggest?",
    "Where would a config parser go?",
)
# Filler for the long prompt: varied enough that it is not one repeated token.
_FILLER = (
    "def handler_{i}(request, session):\n"
    "    value = session.get('key_{i}', {i})\n"
    "    return request.reply(value * {i} + len(request.body))\n"
)


class Workload(BaseModel):
    """How much of each measurement to run."""

    model_config = ConfigDict(frozen=True)

    single_requests: int = Field(3, ge=1, description="streamed one at a time: TTFT and generation tok/s")
    max_tokens: int = Field(32, ge=2, description="generated per request (ignore_eos: always this many)")
    long_prompt_blocks: int = Field(12, ge=1, description="code blocks in the long prompt (~40 tokens each)")
    long_prompt_requests: int = Field(2, ge=1)
    requests_per_slot: int = Field(2, ge=1, description="in the load at the lane's slots")
    prefix_requests: int = Field(4, ge=2, description="sequential requests sharing the repo map")
    interference_requests_per_slot: int = Field(2, ge=1)


# For a busy small machine and tests: one of each, a few tokens.
SMALL = Workload(
    single_requests=1,
    max_tokens=12,
    long_prompt_blocks=4,
    long_prompt_requests=1,
    requests_per_slot=1,
    prefix_requests=2,
    interference_requests_per_slot=1,
)
WORKLOADS = {"default": Workload(), "small": SMALL}


def messages(question: str, shared: bool = True) -> list[dict[str, str]]:
    system = f"{SYSTEM}\n\n{REPO_MAP}" if shared else SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def long_prompt(blocks: int, nonce: int) -> list[dict[str, str]]:
    """A long prompt that starts with a nonce: no prefix cache can serve any of it."""
    code = "\n".join(_FILLER.format(i=i + nonce * 1000) for i in range(blocks))
    return [{"role": "user", "content": f"Request {nonce}. Summarize this code in one line:\n{code}"}]


def question(i: int) -> str:
    return QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" ({i})")


def chat_body(
    model: str, chat: list[dict[str, str]], max_tokens: int, stream: bool = False, exact: bool = True
) -> dict[str, Any]:
    """A chat request both servers take; `exact`: generate exactly max_tokens (ignore_eos), so tokens/s
    compare across models that would stop at different places."""
    body: dict[str, Any] = {
        "model": model,
        "messages": chat,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 0,
    }
    if exact:
        body["ignore_eos"] = True
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body

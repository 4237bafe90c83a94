"""The test-only seam that makes the real CPU-lane server answer with the hostile corpus.

llama-server samples only what a request's GBNF `grammar` allows; a grammar that matches one text alone
makes it emit exactly that text (then end of sequence). `HostileCpuLane` is the CPU-lane resource with two
changes, both for tests only: `run_batch` first hands each request one corpus entry of its stage (by the
batch's label: the asset that asks), and `cpu_client` gives a client that, just before a chat request goes
out, swaps the request's grammar (or JSON schema) for the exact-text grammar of the entry handed to it.
(It also biases sampling towards the text's tokens: fewer, longer steps, the same text.) Everything else
is the production path: the same prompts to the same embedded server, the runner's cache,
parsing and repairs, the assets' judging, the sandbox and the dataset writer.

Requests are matched to their entry by their messages and seed (what the runner sends for a BatchRequest
unless a prompt is shrunk to fit, which the sample repository's small prompts never need). A repair of an
unparseable answer carries the first request's messages and more: it gets the same hostile text again.
A request that matches nothing is recorded and answered with a fixed text, so the test can fail on it.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from lanes_pipeline.cpu_lane.batching.batch import BatchResult
from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest
from lanes_pipeline.cpu_lane.batching.batch_summary import ProgressCallback
from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.cpu_lane.resources import CpuLaneResource, InfoLog
from lanes_pipeline.http import CHAT_PATH, ChatMessage, ChatOutcome, ChatRequest, ChatResponse
from lanes_pipeline_tests.cpu_lane.hostile_corpus import HostileAnswer, Stage

# Which stage asks, by the label each asset gives its batches (`<asset> <repo>`).
STAGE_OF_ASSET: dict[str, Stage] = {
    "repo_analysis": "analysis",
    "generated_tests": "test",
    "refactor_proposals": "diff",
    "generated_docs": "docstring",
}
UNMATCHED_TEXT = "unmatched request"
TOKEN_BIAS = 10.0  # logit bias for the tokens of the exact text (see ExactAnswerClient.chat_outcome)


def exact_grammar(text: str) -> str:
    """A GBNF grammar whose only sentence is `text` (escapes as llama.cpp's grammar parser reads them)."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif 0x20 <= code < 0x7F:
            out.append(char)
        else:
            out.append(
                f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"
            )
    return 'root ::= "' + "".join(out) + '"\n'


def _key(messages: Sequence[ChatMessage], seed: int | None) -> str:
    wire = json.dumps([[m.role, m.content] for m in messages] + [seed])
    return hashlib.sha256(wire.encode()).hexdigest()


def expected_reply(text: str, stop: Sequence[str] | None) -> str:
    """What the server returns of `text`: up to the first stop string the request names."""
    cut = len(text)
    for marker in stop or ():
        found = text.find(marker)
        if found != -1:
            cut = min(cut, found)
    return text[:cut]


@dataclass
class Delivery:
    """One entry sent: to which request, and whether the server's answer was exactly it."""

    entry: str
    request_id: str
    repair: bool = False
    exact: bool | None = None
    finish_reason: str | None = None


@dataclass
class HostileDeliveries:
    """The corpus handed out over a run: entries by request, what each request got back."""

    entries: list[HostileAnswer]
    given: dict[str, HostileAnswer] = field(default_factory=dict)  # request key -> entry
    ids: dict[str, str] = field(default_factory=dict)  # request key -> request id
    prefixes: list[tuple[list[ChatMessage], int | None, str]] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    repeats: list[str] = field(default_factory=list)  # request ids that got an entry a second time
    deliveries: list[Delivery] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def choose(self, stage: Stage, request_id: str) -> HostileAnswer:
        """The entry for a request: an unused one aimed at its symbol, else an unused one for any symbol,
        else (more requests than entries) the stage's entries again, in order."""
        of_stage = [e for e in self.entries if e.stage == stage]
        if not of_stage:
            raise ValueError(f"hostile corpus: no entry for stage {stage!r} (request {request_id!r})")
        fresh = [e for e in of_stage if e.name not in self.used]
        aimed = [e for e in fresh if e.symbol is not None and _symbol_in(e.symbol, request_id)]
        generic = [e for e in fresh if e.symbol is None]
        if aimed or generic:
            chosen = (aimed or generic)[0]
        else:
            self.repeats.append(request_id)
            chosen = of_stage[len(self.repeats) % len(of_stage)]
        self.used.add(chosen.name)
        return chosen

    def assign(self, label: str, requests: Sequence[BatchRequest]) -> None:
        stage = STAGE_OF_ASSET.get(label.split(" ", 1)[0])
        if stage is None:
            raise ValueError(f"hostile lane: no stage for batch label {label!r}")
        with self._lock:
            for request in requests:
                entry = self.choose(stage, request.id)
                key = _key(request.messages, request.seed)
                self.given[key], self.ids[key] = entry, request.id
                self.prefixes.append((list(request.messages), request.seed, key))

    def rewrite(self, chat: ChatRequest) -> tuple[ChatRequest, Delivery | None, str]:
        """The request as sent: its grammar swapped for the exact text of its entry."""
        with self._lock:
            key = _key(chat.messages, chat.seed)
            repair = False
            if key not in self.given:
                key = next(
                    (k for m, seed, k in self.prefixes if seed == chat.seed and chat.messages[: len(m)] == m),
                    "",
                )
                repair = bool(key)
            entry = self.given.get(key)
            if entry is None:
                self.unmatched.append(chat.messages[-1].content[:200])
                text, delivery = UNMATCHED_TEXT, None
            else:
                text = entry.text
                delivery = Delivery(entry=entry.name, request_id=self.ids[key], repair=repair)
                self.deliveries.append(delivery)
        swapped = chat.model_copy(update={"grammar": exact_grammar(text), "response_format": None})
        return swapped, delivery, text

    def delivered(self) -> set[str]:
        return {d.entry for d in self.deliveries if not d.repair}


def _symbol_in(symbol: str, request_id: str) -> bool:
    """Whether a request asks about `symbol` (`path::name`): ids are `<repo or style>:<symbol>`, maybe
    with `#s<sample>` and `+r<round>` after it."""
    tail = request_id.split(":", 1)[1] if ":" in request_id else request_id
    return re.split(r"[#+]", tail, maxsplit=1)[0] == symbol


# What a chat template's special tokens look like ("<|im_start|>", "<|endoftext|>").
SPECIAL_MARKER = re.compile(r"<\|[a-z_]+\|>")


class ExactAnswerClient(CpuClient):
    """The lane's client, sending every chat request with its hostile entry's exact-text grammar."""

    def __init__(self, deliveries: HostileDeliveries, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.deliveries = deliveries

    def chat_outcome(self, request: ChatRequest) -> ChatOutcome:
        swapped, delivery, text = self.deliveries.rewrite(request)
        # Under a grammar the model picks, among the tokens allowed, the ones it likes: often one or two
        # characters long, each costing a step. A bias towards the text's own tokens (the grammar still
        # decides what is allowed) halves the steps; the answer is the same text either way.
        # `parse_special: false`: "<|im_start|>" in a text is its characters, never the special token,
        # which the server would leave out of the answer's content. ik_llama.cpp's /tokenize ignores
        # `parse_special` and gives the special token: that one is banned instead, so the grammar spells
        # the marker out in characters there too.
        tokens = self.request("POST", "/tokenize", json={"content": text, "parse_special": False})
        ids = set(self.expect_ok(tokens).json()["tokens"])
        special = {token for marker in SPECIAL_MARKER.findall(text) for token in self._one_token(marker)}
        bias: list[list[int | float | bool]] = [[t, TOKEN_BIAS] for t in sorted(ids - special)]
        bias += [[t, False] for t in sorted(special)]
        sent = self.send("POST", CHAT_PATH, json={**swapped.payload(), "logit_bias": bias})
        response = ChatResponse.model_validate(self.expect_ok(sent.response).json())
        outcome = ChatOutcome(response, sent.attempts, sent.latency_s)
        if delivery is not None:
            reply = expected_reply(text, request.stop)
            prefill = request.messages[-1].content if request.messages[-1].role == "assistant" else ""
            delivery.exact = outcome.response.text in (reply, prefill + reply)
            delivery.finish_reason = (
                outcome.response.choices[0].finish_reason if outcome.response.choices else None
            )
        return outcome

    def _one_token(self, marker: str) -> list[int]:
        """The marker's token when the server tokenizes it as one (a special token), else none."""
        response = self.request("POST", "/tokenize", json={"content": marker, "parse_special": False})
        tokens = self.expect_ok(response).json()["tokens"]
        return tokens if len(tokens) == 1 else []


class HostileCpuLane(CpuLaneResource):
    """The CPU-lane resource answering from the hostile corpus registered under `hostile_session`."""

    sessions: ClassVar[dict[str, HostileDeliveries]] = {}
    hostile_session: str

    def deliveries(self) -> HostileDeliveries:
        return self.sessions[self.hostile_session]

    def cpu_client(self) -> CpuClient:
        return ExactAnswerClient(
            self.deliveries(),
            self.url,
            self.api_key(),
            timeout_s=self.config.request_timeout_s,
            connect_timeout_s=self.config.connect_timeout_s,
            retry=self.retry_policy(),
        )

    def run_batch(
        self,
        requests: Sequence[BatchRequest],
        log: InfoLog | None = None,
        label: str = "batch",
        progress: ProgressCallback | None = None,
        log_every_s: float = 30.0,
    ) -> BatchResult:
        self.deliveries().assign(label, requests)
        return super().run_batch(requests, log, label, progress, log_every_s)

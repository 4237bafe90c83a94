"""One warmed prefix, every slot: copy the slot that holds it into the idle ones before a group fans out.

Each llama-server slot has its own KV cache. A batch sends the first request of a group that shares a prefix
alone (`batch.prefix_groups`) so the prefix is evaluated once; but the requests that follow run in every slot,
and a slot that has not seen the prefix evaluates all of it again. Upstream llama.cpp hides this with its
host-memory prompt cache (any slot may start from a prompt another slot left there). ik_llama.cpp's
`--cache-ram` keeps only the prompts a slot is about to lose, so on ik each other slot paid for the prefix:
measured by `python -m lanes_pipeline.bench cpu_servers`, prefix reuse 0.57 on ik against a limit of 0.70.

Both servers can save a slot's cache to a file and restore it into another slot (`POST /slots/{id}?action=
save|restore`, enabled by `--slot-save-path`; the embedded ik lane starts with it). Seen on ik with SmolLM2:
2.7k tokens saved in 37 ms and restored in 13 ms, after which two requests sharing that prefix evaluated 9
prompt tokens each. The slot that holds the prefix is found in `/slots` (ik reports each slot's last
prompt); the copy goes only into slots idle at that reading, since a restore into a busy slot waits for it.

`holder_and_targets` is the decision (pure); `PrefixSpreader` does the I/O and remembers a server without
the endpoint, so a server started without `--slot-save-path` costs one request per batch, not one per group.
"""

from __future__ import annotations

import threading

from pydantic import BaseModel

from lanes_pipeline.cpu_lane.batch_models import BatchRequest
from lanes_pipeline.cpu_lane.client import CpuClient, SlotState
from lanes_pipeline.errors import LaneError

# One file per server, overwritten by each group: the copy is needed only until the restores are done.
SLOT_FILE = "lanes-shared-prefix.bin"


class PrefixSpread(BaseModel):
    """What one copy did: from which slot, into which, how many tokens (nothing copied: why)."""

    holder: int | None = None
    restored: list[int] = []
    tokens: int = 0
    skipped: str | None = None  # why nothing was copied: unsupported, no holder, no idle slot, an error


# Enough of the leader's own question to tell its slot from one holding a longer prompt of the same kind; the
# start, since the context-fit rule shrinks a varying part from its end.
LEADER_MARK_CHARS = 200


def leader_texts(request: BatchRequest) -> list[str]:
    """What the slot that just answered `request` shows in its prompt: the fixed messages, the last one's
    shared part, and the start of the request's own varying part (which no other request of the group has).
    Empty when the request shares no prefix."""
    if request.varying_from is None:
        return []
    *fixed, last = request.messages
    own = last.content[request.varying_from :][:LEADER_MARK_CHARS]
    texts = [m.content for m in fixed] + [last.content[: request.varying_from], own]
    return [text for text in texts if text]


def holder_and_targets(slots: list[SlotState], texts: list[str]) -> tuple[int | None, list[int]]:
    """(the idle slot whose last prompt is the leader's, every other idle slot). A slot that holds another
    group's prompt receives the copy too: the group about to fan out needs it now."""
    if not texts:
        return None, []
    holders = [s.id for s in slots if s.idle and s.prompt is not None and all(t in s.prompt for t in texts)]
    if not holders:
        return None, []
    return holders[0], [slot.id for slot in slots if slot.idle and slot.id != holders[0]]


class PrefixSpreader:
    """Copies a group's warmed prefix into a server's idle slots; off for good once the server says it
    cannot (no `--slot-save-path`)."""

    def __init__(self, client: CpuClient) -> None:
        self.client = client
        self.supported: bool | None = None
        self._lock = threading.Lock()  # one copy at a time: they share the slot file

    def spread(self, leader: BatchRequest) -> PrefixSpread:
        """Copy the slot that just answered `leader` into the other idle slots."""
        if self.supported is False:
            return PrefixSpread(skipped="the server has no slot files (start it with --slot-save-path)")
        texts = leader_texts(leader)
        if not texts:
            return PrefixSpread(skipped="the request shares no prefix")
        with self._lock:
            try:
                return self._spread(texts)
            except LaneError as error:  # a copy is an optimisation: the group goes on without it
                return PrefixSpread(skipped=f"copying the prefix failed: {error}")

    def _spread(self, texts: list[str]) -> PrefixSpread:
        slots = self.client.slots()
        if slots is None:
            self.supported = False
            return PrefixSpread(skipped="the server has no /slots")
        if all(slot.prompt is None for slot in slots):
            # Mainline's /slots does not show prompts (it shares prompts across slots on its own): there is
            # no telling which slot holds the prefix, now or later.
            self.supported = False
            return PrefixSpread(skipped="the server's /slots shows no prompts")
        holder, targets = holder_and_targets(slots, texts)
        if holder is None:
            return PrefixSpread(skipped="no idle slot holds the leader's prompt")
        if not targets:
            return PrefixSpread(holder=holder, skipped="no other idle slot")
        saved = self.client.slot_file_action(holder, "save", SLOT_FILE)
        if saved is None:
            self.supported = False
            return PrefixSpread(holder=holder, skipped="the server has no slot files (--slot-save-path)")
        self.supported = True
        restored = []
        for target in targets:
            if self.client.slot_file_action(target, "restore", SLOT_FILE) is not None:
                restored.append(target)
        return PrefixSpread(holder=holder, restored=restored, tokens=saved.n_saved or 0)

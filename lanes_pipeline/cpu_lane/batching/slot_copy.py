"""Copying a group's shared prompt prefix from the slot that evaluated it into the server's other slots,
with llama-server's slot files (`--slot-save-path`), so that no slot evaluates the prefix again.

Why: the first request of a group goes alone (`prefix_order.py`), so its slot holds the prefix when the rest
fan out; but both servers served a prefix only from the slot that evaluated it (ik's host-memory prompt
cache saves a slot's prompt only when that slot moves to another one; upstream's did no better here), so
every other slot evaluated the whole prefix once more: with 2 slots a group of 8 reached 0.857 of the
layout's limit on each. Saving the
slot and restoring the file into each idle slot costs milliseconds (measured on the embedded ik: 11 ms to
save a 273-token slot, 2 ms to restore it; a follower then evaluated 8 of its 269 prompt tokens); a
prefix of thousands of tokens costs a large model seconds in each slot.

A server without slot files (started without `--slot-save-path`: a user's own server, say) answers 404 (ik)
or 501 (upstream), and the batch goes on as before.

A restore needs as many free cells in one run of the KV cache as the file holds. When another client's
request ran beside the leader, their cells interleave, and the target's freed cells leave no such run: the
restore fails (seen: one in eight batches run beside another client's long answer). So a copy is made only
while nothing else runs on the server, and only on a server whose every slot is the batch's; it empties
every slot first (the source's prefix is in the file), so the files are restored into an empty cache.

ik_llama.cpp 0.1.5 as released can leave a slot action unanswered for good, and its HTTP thread with it:
its handlers register for the answer after posting the task (an answer sent in between is dropped), and a
failed action's error goes where the handler does not wait. The embedded build fixes both
(`embedded/ik_patches.py`); on a server built without the fixes each action is bounded and the
first that fails turns copying off for the rest of the batch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from lanes_pipeline.cpu_lane.batching.client import CpuClient
from lanes_pipeline.errors import LaneError
from lanes_pipeline.metrics.bandwidth import cpu_active_requests

# A slot file of a large model's long prompt is hundreds of MB.
SLOT_FILE_TIMEOUT_S = 60.0
# Emptying a slot moves no file.
ERASE_TIMEOUT_S = 5.0
# On an ik built without the fixes above, a slot action sent right after a batch's answers was left
# unanswered more often than one sent a moment later (a save and two erases: 7 of 30 rounds at once, none
# after 50 ms; all five actions: 1 of 60 after 200 ms). The embedded build answered all five in 210 of 210
# rounds with no wait. A copy is made once per prefix group: the wait is cheap.
SLOT_SETTLE_S = 0.2
NOT_EVERY_SLOT = (
    "the batch uses fewer slots than the server has (cpu_lane.max_slots): a copy would find no sure room"
)
NO_SLOT_FILES = "no slot files on this server (start it with --slot-save-path to copy a prefix to every slot)"


@dataclass
class SlotCopy:
    """What one copy did: the slots that now hold the prefix besides the source; when this copy was not made,
    why (`skipped`); when copying should stop for the rest of the batch on this server, why (`off_reason`)."""

    restored: list[int] = field(default_factory=list)
    skipped: str | None = None
    off_reason: str | None = None


def slot_file_name(source: int) -> str:
    """One file per process and source slot, overwritten by the next copy: the folder stays small, and two
    processes sharing a server never read each other's half-written file."""
    return f"lanes-prefix-{os.getpid()}-slot{source}.bin"


def copy_slot(
    client: CpuClient, source: int, targets: list[int], timeout_s: float = SLOT_FILE_TIMEOUT_S
) -> SlotCopy:
    """Save `source`, empty it and each of `targets` (together every slot of the server, none of them busy
    with the caller's requests), and restore the file into each, the source first. Made only while the
    server runs nothing else. Any failure stops the copy and names itself in `off_reason`; what was restored
    before it stays (a slot holds either nothing or the whole prefix)."""
    filename = slot_file_name(source)
    copy = SlotCopy()
    time.sleep(SLOT_SETTLE_S)  # before the check: what runs on the server after the wait is what counts
    busy = cpu_active_requests(client)  # the caller has none there: another client's
    if busy:
        copy.skipped = f"{busy:g} request(s) of another client in flight"
        return copy
    try:
        saved = client.save_slot(source, filename, timeout_s)
        if saved is None:
            copy.off_reason = NO_SLOT_FILES
            return copy
        if not saved.n_saved:
            return copy  # the slot holds nothing (its request failed early): nothing worth copying
        for slot in [source, *targets]:
            client.erase_slot(slot, min(timeout_s, ERASE_TIMEOUT_S))
        for slot in [source, *targets]:
            restored = client.restore_slot(slot, filename, timeout_s)
            if restored is None:
                copy.off_reason = NO_SLOT_FILES
                return copy
            if slot != source:
                copy.restored.append(slot)
    except LaneError as exc:
        copy.off_reason = f"slot copy failed: {exc}"
    return copy

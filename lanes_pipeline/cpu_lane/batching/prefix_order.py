"""The order a batch sends its requests in, so a shared prompt prefix is evaluated once, and the reuse a
perfect prefix cache would reach on what was sent (pure functions).

Requests with the fixed-prefix layout (prompts.PromptLayout) share everything before their varying part. If
every slot started on such requests at once, each slot would evaluate the whole prefix; sending one first,
alone, puts the prefix in the server's cache before the rest fan out to the other slots.

A day's batch has many such groups (a symbol's test samples share everything but the seed). A server slot
holds one prompt: the one it evaluated last. So when a request ends, its slot is the one free, and the next
request sent goes there: `SendOrder` sends next the rest of the group whose request just ended, so each
slot works through a group whose prefix it holds; a new group starts only when that one is done (seen on a
first `make run` day: generated_tests reused 83% against a limit of 94% while every group's first request
went before any group's rest).
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import chain

from lanes_pipeline.cpu_lane.batching.batch_models import BatchRequest


def prefix_key(request: BatchRequest) -> str | None:
    """What the request shares with others of its layout: every message before the last, and the last
    one's text before `varying_from`. None when the request marks no varying part (nothing to share)."""
    if request.varying_from is None:
        return None
    *fixed, last = request.messages
    shared = [m.model_dump(mode="json") for m in fixed] + [last.content[: request.varying_from]]
    return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()


def prefix_groups(
    requests: Sequence[BatchRequest], pending: Sequence[int]
) -> tuple[list[int], dict[int, list[int]]]:
    """(what to send at once, what waits for whom). Of each group of two or more pending requests that share
    a prefix, the first goes alone and the rest wait for it: otherwise every slot would start on the same
    prefix at once and each would evaluate all of it. Requests without a shared prefix go at once."""
    by_key: dict[str, list[int]] = {}
    first: list[int] = []
    for index in pending:
        key = prefix_key(requests[index])
        if key is None:
            first.append(index)
        else:
            by_key.setdefault(key, []).append(index)
    waiting: dict[int, list[int]] = {}
    for members in by_key.values():
        first.append(members[0])
        if len(members) > 1:
            waiting[members[0]] = members[1:]
    return sorted(first), waiting


class SendOrder:
    """Which pending request goes next, given the one that just ended (pure bookkeeping, no I/O).

    `first` and `waiting` are `prefix_groups`'s. A group's rest is released when its first request ends
    (answered or failed: its prefix is in the slot either way). Next after request R: the rest of R's group
    (its prefix is in the slot R freed); else a request of `first` (a new group starts in that slot); else
    the rest of another group (that slot evaluates its prefix once more: nothing better is left)."""

    def __init__(self, first: Sequence[int], waiting: Mapping[int, Sequence[int]]) -> None:
        self.fresh = deque(first)
        self.waiting = {leader: list(rest) for leader, rest in waiting.items()}  # until the first ends
        self.group_of = {i: leader for leader, rest in waiting.items() for i in (leader, *rest)}
        self._released: dict[int, deque[int]] = {}

    def ended(self, index: int) -> bool:
        """Request `index` ended; True when it was the first of a group with a rest, now released."""
        rest = self.waiting.pop(index, None)
        if rest:
            self._released[index] = deque(rest)
        return bool(rest)

    def next_after(self, index: int | None) -> int | None:
        """The next request to send once `index` ended (None: at the start); None when nothing is ready."""
        group = self.group_of.get(index) if index is not None else None
        if group is not None and self._released.get(group):
            return self._released[group].popleft()
        if self.fresh:
            return self.fresh.popleft()
        for rest in self._released.values():
            if rest:
                return rest.popleft()
        return None


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share (a binary search over slice comparisons: a day's batch
    compares each prompt of thousands of tokens with every earlier one)."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # a[:low] == b[:low] holds; find the largest such low
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def shared_prefix_limit(token_lists: Sequence[Sequence[int]]) -> float:
    """The reuse an ideal prefix cache could reach: each prompt's longest common prefix with any earlier
    prompt, over all prompt tokens."""
    cacheable, total = cacheable_prompt_tokens([[tokens] for tokens in token_lists])
    return cacheable / total if total else 0.0


def cacheable_prompt_tokens(sent: Sequence[Sequence[Sequence[int]]]) -> tuple[int, int]:
    """(tokens a perfect prefix cache could serve, prompt tokens) of each item's kept prompt, in send order.

    `sent` has, per item, every prompt the server evaluated for it, the kept one last: one prompt, or the
    same prompt asked again after an empty answer, or the first prompt and then its repair. The kept prompt
    can reuse its longest common prefix with any prompt evaluated before it, its own earlier tries included:
    the limit counts the same prompts as the server's reuse figure (the kept answers' prompt tokens)."""
    cacheable, total, earlier = 0, 0, []
    for prompts in sent:
        if not prompts:
            continue
        *tries, kept = prompts
        seen = chain(earlier, tries)
        cacheable += max((common_prefix_len(kept, other) for other in seen), default=0)
        total += len(kept)
        earlier.extend(prompts)
    return cacheable, total

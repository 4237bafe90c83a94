"""The order a batch sends its requests in, so a shared prompt prefix is evaluated once (pure functions).

Requests with the fixed-prefix layout (prompts.PromptLayout) share everything before their varying part. If
every slot started on such requests at once, each slot would evaluate the whole prefix; sending one first,
alone, puts the prefix in the server's cache before the rest fan out to the other slots.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from lanes_pipeline.cpu_lane.batch_models import BatchRequest


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

"""Copying a warmed prefix into the other slots: the decision without a server, then the real ik_llama.cpp
server (started by the suite with --slot-save-path), where the copy is what lets the second slot skip the
prefix, and a server without slot files, which costs one try and no error."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from lanes_pipeline.cpu_lane.batch_models import BatchRequest
from lanes_pipeline.cpu_lane.client import CpuClient, SlotState
from lanes_pipeline.cpu_lane.prefix_spread import (
    LEADER_MARK_CHARS,
    PrefixSpreader,
    holder_and_targets,
    leader_texts,
)
from lanes_pipeline.cpu_lane.prompts import ASK, PromptLayout
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.settings import Settings

# A shared context long enough that evaluating it twice is plainly visible in the prompt token counts.
CONTEXT = "\n".join(f"def helper_{i}(a, b): return a * {i} + b  # used by module_{i % 7}" for i in range(40))


def layout() -> PromptLayout:
    return PromptLayout(ASK, shared_context=CONTEXT)


def test_the_leader_is_told_by_its_fixed_messages_its_lead_and_its_own_question() -> None:
    request = layout().build("q1", "What does helper_3 return?", 8)
    assert leader_texts(request) == [request.messages[0].content, ASK.lead, "What does helper_3 return?"]
    long = layout().build("q2", "x" * 500, 8)
    assert leader_texts(long)[-1] == "x" * LEADER_MARK_CHARS  # the start: a shrink cuts the end
    unshared = BatchRequest(id="x", messages=request.messages, max_tokens=8)
    assert leader_texts(unshared) == []


def test_the_holder_is_the_idle_slot_with_the_leaders_prompt_and_only_idle_slots_receive_it() -> None:
    texts = ["SYSTEM", "Question: ", "what?"]
    slots = [
        SlotState(id=0, state=0, prompt="<s>SYSTEM more</s><u>Question: other?</u>"),  # same kind, not it
        SlotState(id=1, state=0, prompt="<s>SYSTEM</s><u>Question: what?</u>"),
        SlotState(id=2, state=1, prompt="<s>OTHER</s>"),  # busy: a restore would wait for it
        SlotState(id=3, is_processing=False),  # mainline's shape: idle, no prompt
    ]
    assert holder_and_targets(slots, texts) == (1, [0, 3])
    busy_holder = [SlotState(id=0, state=1, prompt=slots[1].prompt), SlotState(id=1, state=0)]
    assert holder_and_targets(busy_holder, texts) == (None, [])
    assert holder_and_targets(slots, []) == (None, [])


def ask_together(client: CpuClient, model: str, requests: list[BatchRequest]) -> list[int]:
    """Prompt tokens each request made the server evaluate (llama-server's own `timings.prompt_n`)."""

    def ask(request: BatchRequest) -> int:
        response = client.chat(request.chat_request(model))
        assert response.timings is not None and response.timings.prompt_n is not None
        return response.timings.prompt_n

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(ask, requests))


@pytest.mark.cpu_lane
def test_on_ik_the_copy_spares_the_other_slot_the_prefix(
    cpu_server_ik: EmbeddedServer, settings: Settings
) -> None:
    build, model = layout().build, settings.lanes.cpu_lane.model_alias
    with CpuClient(cpu_server_ik.url) as client:
        assert client.server_info(model).total_slots == 2
        prefix_tokens = len(client.tokenize(CONTEXT))
        # Without a copy: a warm request, then two at once; one of them lands in the cold slot.
        cold = PromptLayout(ASK, shared_context=CONTEXT + "\n# the first group").build
        ask_together(client, model, [cold("w0", "Name one helper.", 4)])
        without = ask_together(
            client, model, [cold("a1", "What is helper_1?", 4), cold("a2", "What is helper_2?", 4)]
        )
        # With a copy: the same, but the warmed slot is copied into the other first.
        warm = build("w1", "Name one helper.", 4)
        ask_together(client, model, [warm])
        spread = PrefixSpreader(client).spread(warm)
        with_copy = ask_together(
            client, model, [build("b1", "What is helper_1?", 4), build("b2", "What is helper_2?", 4)]
        )
    assert spread.skipped is None and len(spread.restored) == 1 and spread.tokens > prefix_tokens, spread
    assert max(without) > prefix_tokens, without  # the cold slot evaluated the whole prefix
    assert max(with_copy) < 64, with_copy  # each evaluated only its own question


@pytest.mark.cpu_lane
def test_a_server_without_slot_files_is_asked_once(
    cpu_server_upstream: EmbeddedServer, settings: Settings
) -> None:
    """Upstream, as the suite starts it, has no --slot-save-path: the spreader says so and stops asking."""
    request = layout().build("u1", "Name one helper.", 4)
    with CpuClient(cpu_server_upstream.url) as client:
        client.chat(request.chat_request(settings.lanes.cpu_lane.model_alias))
        spreader = PrefixSpreader(client)
        first = spreader.spread(request)
        sent = client.stats.requests_sent
        second = spreader.spread(request)
        assert client.stats.requests_sent == sent  # nothing more was sent
    assert first.skipped is not None and first.restored == []
    assert spreader.supported is False and second.restored == []

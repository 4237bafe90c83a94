"""The CPU lane's batch runner: many requests, slot-bounded, cached, resumable, measured.

A batch, step by step: wait for the server (bounded), read its slots, context and weights fingerprint once;
answer every request already in the cache without sending anything; send the rest with at most `slots`
completion requests in flight, each committed to the cache the moment it is good. Requests that share a
prompt prefix (the fixed-prefix layout) go one first, alone, so the server caches the prefix once before the
rest fan out (`prefix_order.py`), and when a request ends, the next one sent is the rest of its group (its
prefix is in the slot it freed); where the server keeps slot files, a lone group's first request's slot is
first copied into the idle others, so no slot evaluates the prefix again (`slot_copy.py`). An item that
still fails is recorded with its reason and does not sink the batch. A batch stopped early (Ctrl-C,
SIGTERM, an error that ends it) returns at once: what was answered is committed, the requests in flight
are not waited for, and nothing more is sent.

Retries: the client (`http.OpenAIClient`) retries each HTTP request (transport errors, timeouts, 408, 429,
5xx). The runner adds only what is batch-specific: an empty answer is asked again (ik_llama.cpp can answer
end-of-text at once), an answer that does not parse gets one repair request, and a failed item
is recorded with the number of completion requests it took.

Several endpoints (`cpu_lane.endpoints`): each item is handed to the endpoint with the most free slots
(each endpoint has its own slot gate; the bandwidth cap bounds their total). An endpoint that cannot be
reached after the client's retries, or that answers 5xx and then fails its health check, goes down: no new
item goes to it, and its items in flight go back to the queue for the others. The answer cache is keyed by
the request, so an item is committed once whichever server answers it. With every endpoint down the batch
fails (AllEndpointsDownError), naming them; what was committed stays.

The models live in `batch_models.py`, how an item ends in `batch_outcomes.py`, parsing and repair in
`answer_parsing.py`, the figures in `batch_summary.py`, the slot bound in `slots.py`, the choice of
endpoint in `endpoint_choice.py` and `endpoint_pool.py`.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from pydantic import BaseModel, ValidationError

from lanes_pipeline.cpu_lane.batching.answer_cache import CacheEntry, ResponseCache, cache_key
from lanes_pipeline.cpu_lane.batching.answer_parsing import ParseOutcome, parse_structured, repair_request
from lanes_pipeline.cpu_lane.batching.batch_models import (
    BatchConfig,
    BatchRequest,
    ItemResult,
    request_metrics,
)
from lanes_pipeline.cpu_lane.batching.batch_outcomes import (
    EMPTY_RESEED_STEP,
    Answer,
    ItemFailed,
    Requeue,
    Requeued,
    Stopped,
    failed,
    failure_kind,
    from_cache,
)
from lanes_pipeline.cpu_lane.batching.batch_summary import (
    BatchProgress,
    BatchSummary,
    ProgressCallback,
    summarize,
)
from lanes_pipeline.cpu_lane.batching.client import CpuClient, FittedPrompt, Overflow, ServerInfo
from lanes_pipeline.cpu_lane.batching.endpoint_choice import (
    CLAIMS_PER_SLOT,
    AllEndpointsDownError,
    EndpointReport,
)
from lanes_pipeline.cpu_lane.batching.endpoint_pool import (
    CpuEndpointClient,
    EndpointPool,
    LiveEndpoint,
    open_endpoints,
)
from lanes_pipeline.cpu_lane.batching.prefix_order import SendOrder, prefix_groups
from lanes_pipeline.cpu_lane.batching.slot_copy import copy_slot
from lanes_pipeline.cpu_lane.batching.slots import CapAdmission, SlotGate
from lanes_pipeline.errors import (
    AuthenticationError,
    LaneConnectionError,
    LaneStatusError,
    LaneUnreachableError,
    PromptTooLongError,
)
from lanes_pipeline.http import ChatMessage, ChatRequest, backoff_delay
from lanes_pipeline.metrics.bandwidth import YieldReport


class BatchResult(BaseModel):
    results: list[ItemResult]
    summary: BatchSummary
    server: ServerInfo  # the first endpoint's facts (the weights every endpoint serves)
    bandwidth: YieldReport | None = None  # what yielding to the GPU lane cost, when it was watched
    endpoints: list[EndpointReport] = []  # per endpoint: slots, items answered, whether it went down

    def failed(self) -> list[ItemResult]:
        return [r for r in self.results if r.status == "failed"]


class BatchRunner:
    def __init__(
        self,
        client: CpuClient | Sequence[CpuEndpointClient],
        cache: ResponseCache,
        config: BatchConfig,
        cap: Callable[[], int | None] | None = None,
    ) -> None:
        """`client`: one server (with `config.max_slots`), or several endpoints, each with its slots.
        `cap`: see SlotGate (the bandwidth governor's cap on in-flight requests, over all endpoints)."""
        self.endpoints = (
            [CpuEndpointClient(client, config.max_slots)] if isinstance(client, CpuClient) else list(client)
        )
        self.client = self.endpoints[0].client
        self.cache, self.config, self.cap = cache, config, cap
        # The jitter of the waits before asking again after an empty answer (unseeded: runs at once differ).
        self._rng = random.Random()
        self._rng_lock = threading.Lock()
        self.gate: SlotGate | None = None  # the first endpoint's, once a batch runs
        self.pool: EndpointPool | None = None
        self._read_at = 0.0
        self._stopping = threading.Event()  # set when a batch ends early: its workers send nothing more
        # A group's first request, answered: the endpoint and slot it ran in, until its slot is copied.
        self._leader_slots: dict[int, tuple[LiveEndpoint, int]] = {}

    def prepare(self) -> EndpointPool:
        admission = CapAdmission(self.cap)
        config = self.config
        return open_endpoints(
            self.endpoints, config.configured_model, config.ready_timeout_s, config.lease_dir, admission
        )

    def run(self, requests: Sequence[BatchRequest], progress: ProgressCallback | None = None) -> BatchResult:
        started = time.monotonic()
        self.pool = pool = self.prepare()
        info = pool.live[0].info
        limit = pool.total_limit
        self.gate = pool.live[0].gate

        keys = [cache_key(r.chat_request(self.config.model_alias), info.fingerprint) for r in requests]
        self._read_at = time.time()  # what another run commits after this is newer than what was read
        entries = self.cache.get_many(keys)
        results: list[ItemResult | None] = [None] * len(requests)
        pending: list[int] = []
        for index, (request, key) in enumerate(zip(requests, keys, strict=True)):
            entry = entries.get(key)
            if entry is not None and self._usable(entry, request, info):
                results[index] = from_cache(index, request, entry)
            else:
                pending.append(index)

        counts = Counter(hits=len(requests) - len(pending))

        def report() -> None:
            if progress is not None:
                done = counts["hits"] + counts["answered"] + counts["failed"]
                progress(
                    BatchProgress(
                        len(requests),
                        done,
                        counts["hits"],
                        counts["failed"],
                        time.monotonic() - started,
                        counts["answered"],
                    )
                )

        report()
        order = SendOrder(*prefix_groups(requests, pending))
        by_url = {e.client.base_url: e.index for e in pool.live}
        near: dict[int, int | None] = {}  # a group's first request -> the endpoint that answered it
        lost_sends: Counter[int] = Counter()  # requests sent for an item on endpoints that went down
        # No more items at once than slots: when one ends, the next is chosen for the slot it freed
        # (SendOrder), which token counting ahead for a queued item would not allow (it takes ms next to
        # a completion). More threads than that for the items re-queued when an endpoint goes down.
        threads = ThreadPoolExecutor(max_workers=CLAIMS_PER_SLOT * limit, thread_name_prefix="cpu-lane")
        self._stopping = threading.Event()

        sent_order: dict[int, int] = {}  # item -> when it was first sent, for the reuse limit

        def submit(i: int) -> Future[ItemResult | Requeued]:
            sent_order.setdefault(i, len(sent_order))
            group = order.group_of.get(i)
            preferred = near.get(group) if group is not None else None
            # The first of the last group waiting: its slot may be copied once it ends (see below).
            leads = i in order.waiting and len(order.waiting) == 1
            return threads.submit(self._run_item, i, requests[i], keys[i], info, preferred, leads)

        remaining: set[Future[ItemResult | Requeued]] = set()

        def fill(after: int | None) -> None:
            while len(remaining) < limit and (i := order.next_after(after)) is not None:
                remaining.add(submit(i))

        fill(None)
        try:
            while remaining:
                finished, remaining = wait(remaining, return_when=FIRST_COMPLETED)
                for future in finished:
                    # Only AuthenticationError, AllEndpointsDownError and bugs raise here: they end it.
                    result = future.result()
                    if isinstance(result, Requeued):  # its endpoint went down: ask another
                        lost_sends[result.index] += result.sent
                        remaining.add(submit(result.index))
                        continue
                    if lost_sends[result.index]:
                        result.requests_sent += lost_sends[result.index]
                    result.sent_order = sent_order[result.index]
                    results[result.index] = result
                    counts["failed" if result.status == "failed" else "answered"] += 1
                    # The prefix is in that server's slot cache now (or the first failed: go on anyway).
                    # It is copied into the other slots where the server can, so none evaluates it again;
                    # only once no other group waits to fan out, whose prefix a slot may still hold.
                    if order.ended(result.index):
                        near[result.index] = by_url.get(result.endpoint or "")
                        if result.status == "ok" and not order.waiting:
                            self._copy_prefix(result.index)
                    self._leader_slots.pop(result.index, None)
                    fill(result.index)
                    report()
        except BaseException:
            # Ctrl-C, SIGTERM (raised here by Dagster or the command), or an error that ends the batch: the
            # requests in flight are not waited for (one can take minutes); they end with their answer
            # committed, or fail when their server stops, and no worker sends anything after this.
            self._stopping.set()
            threads.shutdown(wait=False, cancel_futures=True)
            raise
        threads.shutdown()
        final = [r for r in results if r is not None]
        return BatchResult(
            results=final,
            summary=summarize(final, time.monotonic() - started, sum(r.slot_copies for r in pool.reports())),
            server=info,
            endpoints=pool.reports(),
        )

    def _usable(self, entry: CacheEntry, request: BatchRequest, info: ServerInfo) -> bool:
        if entry.shrunk_for_ctx is not None and (
            self.config.overflow != "shrink" or entry.shrunk_for_ctx != info.per_slot_ctx
        ):
            return False
        if request.output_model is not None:
            try:
                request.output_model.model_validate(entry.parsed)
            except ValidationError:
                return False  # the model's validators changed since: ask again
        return True

    def _run_item(
        self,
        index: int,
        request: BatchRequest,
        key: str,
        info: ServerInfo,
        preferred: int | None,
        leads: bool = False,
    ) -> ItemResult | Requeued:
        """The item on one endpoint, chosen now; `info` is the batch's (its weights fingerprint). `leads`:
        the first request of a prefix group runs in a slot of its own choosing, so the runner knows which
        slot to copy once it is answered."""
        assert self.pool is not None
        endpoint = self.pool.claim(preferred)
        slot = self.pool.pin_slot(endpoint) if leads else None
        try:
            result = self._on_endpoint(endpoint, index, request, key, info, slot)
            if slot is not None:
                self._leader_slots[index] = (endpoint, slot)
            return result
        except Requeue as exc:
            self.pool.gave_back(endpoint)
            return Requeued(index, exc.sent)
        finally:
            self.pool.release(endpoint)

    def _copy_prefix(self, leader: int) -> None:
        """Copy the leader's slot into the endpoint's other slots before its group fans out, when nothing
        else of the batch runs there (only then are those slots known to be idle); otherwise the group
        fans out as it is, each other slot evaluating the prefix once."""
        assert self.pool is not None
        pinned = self._leader_slots.get(leader)
        if pinned is None or self._stopping.is_set():
            return
        endpoint, source = pinned
        if not endpoint.copies_slots:
            return
        with self.pool.alone(endpoint) as alone:
            if not alone:
                return
            targets = [slot for slot in range(endpoint.gate.limit) if slot != source]
            copy = copy_slot(endpoint.client, source, targets)
        self.pool.copied(endpoint, copy)

    def _on_endpoint(
        self,
        endpoint: LiveEndpoint,
        index: int,
        request: BatchRequest,
        key: str,
        info: ServerInfo,
        slot: int | None = None,
    ) -> ItemResult:
        sent = 0
        server = endpoint.info  # its own context decides what fits; the weights are the batch's
        try:
            fitted = self._fit(
                endpoint,
                request.id,
                request.messages,
                request.varying_from,
                request.max_tokens,
                self.config.overflow,
            )
            chat = request.chat_request(self.config.model_alias, fitted.messages)
            if slot is not None:  # after the cache key: where it runs does not change what is asked
                chat = chat.model_copy(update={"id_slot": slot})
            answer = self._send(endpoint, chat, request.id, fitted.token_ids)
            sent += answer.sent
            text, parsed, repaired = answer.response.text, None, False
            if request.json_schema is not None:
                outcome = parse_structured(text, request.output_model)
                if not outcome.ok:
                    answer, outcome = self._repair(endpoint, request, fitted.messages, answer, outcome.error)
                    sent += answer.sent
                    repaired = True
                text, parsed = answer.response.text, outcome.value
        except PromptTooLongError as exc:
            return failed(self.cache, index, request, key, info, ItemFailed("too_long", str(exc), sent))
        except ItemFailed as exc:
            exc.sent += sent
            return failed(self.cache, index, request, key, info, exc)
        except Requeue as exc:
            exc.sent += sent
            raise
        entry = CacheEntry(
            key=key,
            fingerprint=info.fingerprint,
            item_id=request.id,
            text=text,
            parsed=parsed,
            metrics=answer.metrics.model_dump(),
            shrunk_for_ctx=server.per_slot_ctx if fitted.shrunk else None,
            attempts=sent,
            repaired=repaired,
            read_at=self._read_at,
        )
        self.cache.put(entry)  # committed before the item counts as done: a kill after this loses nothing
        # Another run that asked the same request at once and committed first: its answer was kept, and this
        # run uses it too, so both build the same artifacts.
        kept = self.cache.get(key)
        if kept is not None and kept.text != text:
            text, parsed = kept.text, kept.parsed
        assert self.pool is not None
        self.pool.answered(endpoint)
        return ItemResult(
            index=index,
            id=request.id,
            key=key,
            status="ok",
            text=text,
            parsed=parsed,
            metrics=answer.metrics,
            requests_sent=sent,
            discarded_answers=answer.discarded,
            discarded_completion_tokens=answer.discarded_tokens,
            repaired=repaired,
            shrunk=fitted.shrunk,
            endpoint=endpoint.client.base_url,
            sent_prompts=answer.prompts,
        )

    def _repair(
        self,
        endpoint: LiveEndpoint,
        request: BatchRequest,
        sent_messages: list[ChatMessage],
        first: Answer,
        error: str,
    ) -> tuple[Answer, ParseOutcome]:
        """One repair attempt; still unparseable afterwards -> the item fails as 'unparseable'."""
        fixed = repair_request(
            request.model_copy(update={"messages": sent_messages}),
            first.response.text,
            error,
            first.metrics.truncated,
        )
        try:
            fitted = self._fit(endpoint, request.id, fixed.messages, None, fixed.max_tokens, "error")
        except PromptTooLongError:
            raise ItemFailed(
                "unparseable", f"{error} (no room left in the context for a repair)", 0
            ) from None
        chat = fixed.chat_request(self.config.model_alias, fitted.messages)
        answer = self._send(endpoint, chat, request.id, fitted.token_ids)
        outcome = parse_structured(answer.response.text, request.output_model)
        if not outcome.ok:
            raise ItemFailed("unparseable", f"{error}; after one repair: {outcome.error}", answer.sent)
        answer.discarded += first.discarded + 1
        answer.discarded_tokens += first.discarded_tokens + first.metrics.completion_tokens
        answer.prompts = (
            None if first.prompts is None or answer.prompts is None else first.prompts + answer.prompts
        )
        return answer, outcome

    def _fit(
        self,
        endpoint: LiveEndpoint,
        item: str,
        messages: list[ChatMessage],
        varying_from: int | None,
        max_tokens: int,
        overflow: Overflow,
    ) -> FittedPrompt:
        """Count tokens (and shrink); the client retries these requests like any other, and a server that
        still fails them fails the item, not the batch (or, with several endpoints, takes its server down)."""
        try:
            info = endpoint.info
            return endpoint.client.fit_prompt(item, messages, varying_from, max_tokens, info, overflow)
        except AuthenticationError:
            raise
        except (LaneStatusError, LaneUnreachableError) as exc:
            self._endpoint_trouble(endpoint, exc, 0)
            raise ItemFailed(failure_kind(exc), f"item {item!r}: {exc}", 0) from None

    def _endpoint_trouble(
        self, endpoint: LiveEndpoint, error: LaneStatusError | LaneUnreachableError, sent: int
    ) -> None:
        """A request failed: when it failed for its server's sake (unreachable; or 5xx and, with several
        endpoints, a failed health check) and another endpoint is up, the item goes back to the queue
        (raises Requeue); with none left the batch ends. Otherwise returns: the item fails as always."""
        assert self.pool is not None
        if isinstance(error, LaneStatusError) and (
            not error.retryable or self.pool.configured == 1 or self._healthy(endpoint)
        ):
            return
        action = self.pool.failed(endpoint, str(error))
        if action == "requeue":
            raise Requeue(sent)
        if action == "all_down":
            raise AllEndpointsDownError(self.pool.reports())

    @staticmethod
    def _healthy(endpoint: LiveEndpoint) -> bool:
        try:
            code, _ = endpoint.client.health()
        except LaneUnreachableError:
            return False
        return code == 200

    def _send(
        self, endpoint: LiveEndpoint, chat: ChatRequest, item: str, token_ids: tuple[int, ...] | None
    ) -> Answer:
        """One completion (the client retries the HTTP request); an empty answer is asked again, as often
        as the lane's policy allows. Seen on ik_llama.cpp at temperature 0: a prompt evaluated whole can
        give end-of-text first, and asked again (its prefix now cached) it gets an answer.

        The wait before asking again matters on ik: asked again at once, the same prompt met the same
        slot state and was empty again (4 of 4 tries, 2 items of 16); after the backoff, other requests
        have moved the slots on and it gets an answer. A sampled request (temperature > 0) is asked with
        another seed, since its own seed draws the same end-of-text again. A free-text request's last try
        ignores end-of-text (`ignore_eos`): its answer runs to a stop string or max_tokens, and the checks
        after it (parsing, the sandbox) decide what it is worth; seen on ik, a sampled oracle request was
        empty on all 4 tries. A grammar's end must stay reachable, so structured requests keep it. Either
        way the answer is cached under the request as asked, so a re-run reuses it."""
        assert self.pool is not None
        policy, sent, empty, empty_tokens = endpoint.client.retry, 0, 0, 0
        for attempt in range(1, policy.max_attempts + 1):
            if attempt > 1:
                with self._rng_lock:
                    delay = backoff_delay(attempt - 1, policy.backoff_base_s, policy.backoff_max_s, self._rng)
                self._stopping.wait(delay)
                if chat.temperature > 0:
                    # Far from the sample seeds 0..n-1, so a retry never repeats another sample's request.
                    step = EMPTY_RESEED_STEP * (attempt - 1)
                    chat = chat.model_copy(update={"seed": (chat.seed or 0) + step})
                if attempt == policy.max_attempts and chat.grammar is None and chat.response_format is None:
                    chat = chat.model_copy(update={"ignore_eos": True})
            try:
                with endpoint.gate.hold():
                    if self._stopping.is_set():
                        raise Stopped(f"item {item!r} not sent: the batch was stopped")
                    if not self.pool.is_up(endpoint):  # it went down while this item waited for a slot
                        raise Requeue(sent)
                    outcome = endpoint.client.chat_outcome(chat)
            except AuthenticationError:
                raise  # a refused key ends the whole batch: every other item would fail the same way
            except (LaneStatusError, LaneConnectionError) as exc:
                sent += exc.attempts
                self._endpoint_trouble(endpoint, exc, sent)
                raise ItemFailed(failure_kind(exc), f"item {item!r}: {exc}", sent) from None
            sent += outcome.attempts
            if outcome.response.text.strip():
                metrics = request_metrics(outcome.response, outcome.latency_s, chat.max_tokens)
                prompts = None if token_ids is None else [token_ids] * (empty + 1)
                return Answer(outcome.response, metrics, sent, empty, empty_tokens, prompts)
            empty, empty_tokens = empty + 1, empty_tokens + outcome.response.usage.completion_tokens
        reason = f"item {item!r}: the server answered with empty content (after {sent} attempts)"
        raise ItemFailed("empty", reason, sent)

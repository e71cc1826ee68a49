"""A scripted OpenAI-compatible server for tests and benchmarks: a stand-in for an external API.

It answers ``POST .../chat/completions`` (any path prefix, so ``/v1/...`` and
``/rollouts/<rollout_id>/v1/...`` both work) and ``.../completions`` with a fixed or computed reply,
usage counts and a response id, and ``GET .../models``. Streaming requests get server-sent events.
Every request is recorded (path, headers, JSON body) so tests can check what the client sent, e.g. the
``traceparent`` and ``baggage`` headers.

    with FakeOpenAI(reply="42") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x")

Standard library only, so any test or bench script can use it; runs in a daemon thread.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

__all__ = ["FakeOpenAI", "RecordedRequest"]

Reply = str | Callable[[dict[str, Any]], str]


@dataclass
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any] | None


@dataclass
class FakeOpenAI:
    """OpenAI-compatible test server. ``reply`` is the assistant text, or a function of the request body."""

    reply: Reply = "ok"
    model: str = "fake-model"
    delay_s: float = 0.0  # server-side time per completion, to stand in for model latency
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    record: bool = True  # keep every request in `requests` (turn off for long benchmarks)
    requests: list[RecordedRequest] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _count: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:PORT``."""
        if self._server is None:
            raise RuntimeError("FakeOpenAI is not started; call start() or use it as a context manager")
        return f"http://{self.host}:{self._server.server_address[1]}"

    @property
    def base_url(self) -> str:
        """The ``OPENAI_BASE_URL`` to give a client: ``<url>/v1``."""
        return self.url + "/v1"

    def start(self) -> FakeOpenAI:
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer((self.host, self.port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_id(self) -> int:
        with self._lock:
            self._count += 1
            return self._count

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat.completion object answering ``body``."""
        text = self.reply(body) if callable(self.reply) else self.reply
        n = self._next_id()
        prompt_words = sum(len(str(m.get("content") or "").split()) for m in body.get("messages") or [])
        return {
            "id": f"chatcmpl-fake-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_words,
                "completion_tokens": len(text.split()),
                "total_tokens": prompt_words + len(text.split()),
            },
        }


def _make_handler(server: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stall

        def log_message(self, format: str, *args: Any) -> None:  # silence stderr
            pass

        def _send_json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self, body: dict[str, Any] | None) -> None:
            if server.record:
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append(RecordedRequest(self.command, self.path, headers, body))

        def do_GET(self) -> None:
            self._record(None)
            if self.path.rstrip("/").endswith("/models"):
                self._send_json(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
            else:
                self._send_json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._send_json(400, {"error": {"message": "body is not JSON"}})
                return
            self._record(body)
            path = self.path.split("?", 1)[0].rstrip("/")
            if not path.endswith("/chat/completions"):
                self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                return
            if server.delay_s:
                time.sleep(server.delay_s)
            result = server.completion(body)
            if body.get("stream"):
                self._stream(result)
            else:
                self._send_json(200, result)

        def _stream(self, result: dict[str, Any]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            choice = result["choices"][0]
            base = {k: result[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
            chunks = [
                base | {"choices": [{"index": 0,
                                     "delta": {"role": "assistant", "content": choice["message"]["content"]},
                                     "finish_reason": None}]},
                base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": result["usage"]},
            ]
            for chunk in chunks:
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler

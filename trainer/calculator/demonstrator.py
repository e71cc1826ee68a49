"""The careless demonstrator as an OpenAI-compatible chat server (standard library only).

The calculator agent talks to it exactly as it talks to the policy server (any path prefix, so
``/rollouts/<id>/v1/chat/completions`` works); the OpenAI instrumentor records each call's messages, and
spanrl turns those traces into supervised-fine-tuning data. Each answer is
``tasks.demonstrate(last user message)``.

    with DemonstratorServer(seed=0) as server:
        base_url = server.url + "/v1"
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from spanrl.trainer.calculator.tasks import demonstrate

__all__ = ["DemonstratorServer"]


class DemonstratorServer:
    """Serves ``POST .../chat/completions`` with the demonstrator's answers, in a daemon thread."""

    def __init__(self, *, seed: int = 0, host: str = "127.0.0.1", port: int = 0) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="demonstrator", daemon=True)
        self.host = host

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:PORT`` (append ``/v1`` for an OpenAI client)."""
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> DemonstratorServer:
        self._thread.start()
        return self

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> DemonstratorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def answer(self, body: dict[str, Any]) -> str:
        question = next((m.get("content") for m in reversed(body.get("messages", [])) if m.get("role") == "user"), "")
        with self._lock:
            return demonstrate(str(question), self._rng)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._send(400, {"error": {"message": "request body is not JSON"}})
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    text = owner.answer(body)
                except ValueError as exc:
                    self._send(400, {"error": {"message": str(exc)}})
                    return
                words = len(text.split())
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{uuid.uuid4().hex}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "demonstrator"),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 4, "completion_tokens": words, "total_tokens": 4 + words},
                    },
                )

        return Handler

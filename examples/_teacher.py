"""A scripted teacher as an OpenAI-compatible chat server (standard library only), for SFT warm starts.

Agents talk to it exactly as to the policy server (any path prefix, so
``/rollouts/<id>/v1/chat/completions`` works); the OpenAI instrumentor records each call's messages,
and spanrl turns those traces into supervised-fine-tuning data (``Trainer(llm_url=teacher.url)``).

    with TeacherServer(lambda messages, rng: "SELECT 1", seed=0) as teacher:
        base_url = teacher.url + "/v1"
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["TeacherServer"]

AnswerFn = Callable[[list[dict[str, Any]], random.Random], str]


class TeacherServer:
    """Serves ``POST .../chat/completions`` with ``answer(messages, rng)``, in a daemon thread."""

    def __init__(self, answer: AnswerFn, *, seed: int = 0, host: str = "127.0.0.1", port: int = 0) -> None:
        self._answer = answer
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="teacher", daemon=True)
        self.host = host
        self.requests = 0

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:PORT`` (append ``/v1`` for an OpenAI client)."""
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> TeacherServer:
        self._thread.start()
        return self

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> TeacherServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests += 1
            text = self._answer(list(body.get("messages") or []), self._rng)
        return {
            "id": f"chatcmpl-teacher-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "teacher",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                         "logprobs": None}],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(text.split()), "total_tokens": len(text.split())},
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        teacher = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._send(400, {"error": {"message": "body is not JSON"}})
                    return
                if not self.path.split("?", 1)[0].rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                self._send(200, teacher.completion(body))

        return Handler

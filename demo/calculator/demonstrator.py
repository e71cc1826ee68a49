"""Scripted OpenAI-compatible chat servers (standard library only): the demo's careless demonstrator, and
the generic :class:`ScriptedChatServer` it is made of (examples use it as an SFT teacher).

Agents talk to them exactly as to the policy server (any path prefix, so
``/rollouts/<id>/v1/chat/completions`` works); the OpenAI instrumentor records each call's messages, and
spanrl turns those traces into supervised-fine-tuning data (``Trainer(llm_url=server.url)``).

    with DemonstratorServer(seed=0) as server:
        base_url = server.url + "/v1"
    with ScriptedChatServer(lambda messages, rng: "SELECT 1", seed=0) as teacher:
        ...
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from spanrl.demo.calculator.tasks import demonstrate

__all__ = ["AnswerFn", "DemonstratorServer", "ScriptedChatServer"]

AnswerFn = Callable[[list[dict[str, Any]], random.Random], str]
"""``answer(messages, rng) -> text``; a ValueError is answered 400 with its message. ``rng`` is seeded
from the server's seed, the messages and how many times these messages came before, so the answers to
a set of requests are the same whatever order concurrent agents send them in, and a repeated question
still gets independent draws (one shared generator made the demo's SFT data, and so its held-out
success after SFT, differ from run to run: 0.55 to 0.80 with seed 0)."""


class ScriptedChatServer:
    """Serves ``POST .../chat/completions`` with ``answer(messages, rng)``, in a daemon thread."""

    def __init__(self, answer: AnswerFn, *, seed: int = 0, host: str = "127.0.0.1", port: int = 0,
                 name: str = "teacher") -> None:
        self._answer = answer
        self._seed = seed
        self._asked: dict[str, int] = {}  # conversation digest -> times answered
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self.host = host
        self.name = name
        self.requests = 0
        """Chat requests answered so far."""

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:PORT`` (append ``/v1`` for an OpenAI client)."""
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> ScriptedChatServer:
        self._thread.start()
        return self

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ScriptedChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat.completion answering ``body`` (raises ValueError for a request it cannot answer)."""
        messages = list(body.get("messages") or [])
        digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        with self._lock:
            self.requests += 1
            nth = self._asked[digest] = self._asked.get(digest, -1) + 1
        text = self._answer(messages, random.Random(f"{self._seed}/{digest}/{nth}"))  # str seeds are stable
        words = len(text.split())
        return {
            "id": f"chatcmpl-{self.name}-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                         "logprobs": None}],
            "usage": {"prompt_tokens": 0, "completion_tokens": words, "total_tokens": words},
        }

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
                if not self.path.split("?", 1)[0].rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    self._send(200, owner.completion(body))
                except ValueError as exc:
                    self._send(400, {"error": {"message": str(exc)}})

        return Handler


def _demonstrate_last_question(messages: list[dict[str, Any]], rng: random.Random) -> str:
    question = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
    return demonstrate(str(question), rng)


class DemonstratorServer(ScriptedChatServer):
    """The careless demonstrator: each answer is ``tasks.demonstrate(last user message)``."""

    def __init__(self, *, seed: int = 0, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(_demonstrate_last_question, seed=seed, host=host, port=port, name="demonstrator")

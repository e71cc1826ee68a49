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
success after SFT, differ from run to run: 0.55 to 0.80 with seed 0). With ``seed_by_rollout``, a request
whose path names its rollout (``/rollouts/<run tag>-<step>-<index>-a<attempt>/``) is seeded by that rollout
instead of by arrival: which rollout gets which answer is then fixed too, and the SFT data's order with it."""


class ScriptedChatServer:
    """Serves ``POST .../chat/completions`` with ``answer(messages, rng)``, in a daemon thread."""

    def __init__(self, answer: AnswerFn, *, seed: int = 0, host: str = "127.0.0.1", port: int = 0,
                 name: str = "teacher", seed_by_rollout: bool = False) -> None:
        self._answer = answer
        self._seed = seed
        self._seed_by_rollout = seed_by_rollout
        self._asked: dict[tuple[str, str], int] = {}  # (conversation digest, rollout) -> times answered
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

    def completion(self, body: dict[str, Any], path: str = "") -> dict[str, Any]:
        """The chat.completion answering ``body`` sent to ``path`` (raises ValueError for a request it cannot
        answer)."""
        messages = list(body.get("messages") or [])
        digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        rollout = _rollout_in_path(path) if self._seed_by_rollout else ""
        with self._lock:
            self.requests += 1
            nth = self._asked[digest, rollout] = self._asked.get((digest, rollout), -1) + 1
        key = f"{self._seed}/{digest}/{rollout}/{nth}" if rollout else f"{self._seed}/{digest}/{nth}"
        text = self._answer(messages, random.Random(key))  # str seeds are stable
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
            # Headers and body go out in two writes; with Nagle's algorithm the body waited for the client's
            # delayed ACK of the headers on a kept-alive connection: ~40 ms a call (the demo's 800 SFT
            # demonstrations took 46 ms each, 2 without).
            disable_nagle_algorithm = True

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
                    self._send(200, owner.completion(body, self.path))
                except ValueError as exc:
                    self._send(400, {"error": {"message": str(exc)}})

        return Handler


def _rollout_in_path(path: str) -> str:
    """The rollout id in ``.../rollouts/<id>/...`` less its first part, the Trainer's random run tag (the rest,
    step, index and attempt, is the same in every run of one seed); "" where the path names none."""
    parts = path.split("?", 1)[0].split("/")
    rollout = parts[parts.index("rollouts") + 1] if "rollouts" in parts[:-1] else ""
    return rollout.split("-", 1)[-1]


def _demonstrate_last_question(messages: list[dict[str, Any]], rng: random.Random) -> str:
    question = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
    return demonstrate(str(question), rng)


class DemonstratorServer(ScriptedChatServer):
    """The careless demonstrator: each answer is ``tasks.demonstrate(last user message)``."""

    def __init__(self, *, seed: int = 0, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(_demonstrate_last_question, seed=seed, host=host, port=port, name="demonstrator")

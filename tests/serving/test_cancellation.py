"""A client that hangs up stops its generation (issue 53, finding 7). The probe: after 3 streamed n=64 requests
were dropped after their first token, a 2-token request took 7.98 s (0.31 s before): the dropped ones ran to
max_tokens ahead of it. Now each dropped stream ends at the next decode step and leaves one error span. Told by
the tokens the server generated (its ``/metrics``), not by a short request's latency."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from spanrl.serving import PolicyServer, ServerConfig
from spanrl.serving.responses import CANCELLED

_SHORT = {"model": "tiny", "messages": [{"role": "user", "content": "1 add 2"}], "max_tokens": 2, "temperature": 0}
_LONG = {**_SHORT, "n": 64, "max_tokens": 400, "temperature": 1.0, "stream": True}


@pytest.fixture
def server(tiny_model_dir) -> Iterator[tuple[PolicyServer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    config = ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny", max_batch_size=64)
    with PolicyServer(config, span_exporter=exporter) as s:
        yield s.start(), exporter


def _generated(server: PolicyServer) -> int:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("spanrl:generation_tokens_total")))


@pytest.fixture
def held_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sequence's decoding waits after its first token until its request is cancelled (the test hangs up),
    so what a dropped request costs is exact whatever the machine's load: the fix stops each sequence at its
    second token (2 per sequence); without it, each runs on to its end (up to 400)."""
    from spanrl.serving.hf_backend import TransformersBackend

    append = TransformersBackend._append

    def held(self: Any, row: Any, token: int, logprob: float, top: Any) -> bool:
        goes_on = append(self, row, token, logprob, top)
        deadline = time.monotonic() + 60  # a hang guard (the batcher's thread: no assert here)
        while len(row.token_ids) == 1 and not row.request.cancelled and time.monotonic() < deadline:
            time.sleep(0.002)
        return goes_on

    monkeypatch.setattr(TransformersBackend, "_append", held)


def _stopped_at_once(spent: int, rows: int) -> bool:
    """3 dropped requests of ``rows`` sequences each cost 2 tokens a sequence with the fix (checked: without it,
    31,494 tokens for n=64 and 625 for one sequence: the tiny model often stops before 400)."""
    print(f"{spent} tokens generated for 3 dropped requests of {rows} sequences")
    return spent <= 3 * rows * 2


def _post_and_hang_up(server: PolicyServer, path: str, body: dict) -> None:
    """A plain (non-streamed) request whose client hangs up once its first token is generated (the server's
    token count moved; the sequences then wait, ``held_until_cancelled``)."""
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps(body).encode()
    before = _generated(server)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        deadline = time.monotonic() + 60  # a hang guard
        while _generated(server) == before:
            assert time.monotonic() < deadline, "generation never started"
            time.sleep(0.005)


def _until_cancelled(server: PolicyServer, exporter: InMemorySpanExporter, n: int) -> None:
    """Until the server recorded ``n`` cancellations (its own record of each, not a guess of its length)."""
    deadline = time.monotonic() + 60  # a hang guard
    while len(_cancelled_spans(server, exporter)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_cancelled_spans(server, exporter)) == n


def _cancelled_spans(server: PolicyServer, exporter: InMemorySpanExporter) -> list:
    server.force_flush()
    return [s for s in exporter.get_finished_spans()
            if s.status.status_code == StatusCode.ERROR and s.status.description == CANCELLED]


@pytest.mark.parametrize(("path", "first_token"), [("/v1/chat/completions", '"token_ids": ['),
                                                   ("/v1/responses", "response.output_text.delta")])
def test_a_dropped_stream_stops_generating(server, held_until_cancelled, path, first_token):
    server, exporter = server
    generated = _generated(server)
    body = _LONG if path == "/v1/chat/completions" else {
        "model": "tiny", "input": "1 add 2", "max_output_tokens": 400, "stream": True}
    for i in range(3):
        with httpx.Client(timeout=120) as client, client.stream("POST", server.base_url + path, json=body) as reply:
            for line in reply.iter_lines():  # generation is under way once a token arrives
                if first_token in line and '"token_ids": []' not in line:
                    break
        # leaving the block closes the connection mid-stream
        _until_cancelled(server, exporter, i + 1)  # the next request starts after this one's end
    assert _stopped_at_once(_generated(server) - generated, rows=body.get("n", 1))


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {**_LONG, "stream": False}),
    ("/v1/completions", {"model": "tiny", "prompt": "1 add 2", "n": 64, "max_tokens": 400, "temperature": 1.0}),
])
def test_a_dropped_non_streamed_request_stops_generating(server, held_until_cancelled, path, body):
    """A client that gives up on a plain (non-streamed) reply: its generation ends too, as vLLM's server does."""
    server, exporter = server
    generated = _generated(server)
    for i in range(3):
        _post_and_hang_up(server, path, body)
        _until_cancelled(server, exporter, i + 1)
    assert _stopped_at_once(_generated(server) - generated, rows=body["n"])

"""A client that hangs up stops its generation (issue 53, finding 7). The probe: after 3 streamed n=64 requests
were dropped after their first token, a 2-token request took 7.98 s (0.31 s before): the dropped ones ran to
max_tokens ahead of it. Now each dropped stream ends at the next decode step and leaves one error span."""

from __future__ import annotations

import time
from collections.abc import Iterator

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


def _timed(server: PolicyServer, body: dict, path: str = "/v1/chat/completions") -> float:
    started = time.monotonic()
    assert httpx.post(server.base_url + path, json=body, timeout=120).status_code == 200
    return time.monotonic() - started


def _cancelled_spans(server: PolicyServer, exporter: InMemorySpanExporter) -> list:
    server.force_flush()
    return [s for s in exporter.get_finished_spans()
            if s.status.status_code == StatusCode.ERROR and s.status.description == CANCELLED]


@pytest.mark.parametrize(("path", "first_token"), [("/v1/chat/completions", '"token_ids": ['),
                                                   ("/v1/responses", "response.output_text.delta")])
def test_a_dropped_stream_stops_generating(server, path, first_token):
    server, exporter = server
    before = min(_timed(server, _SHORT) for _ in range(3))
    body = _LONG if path == "/v1/chat/completions" else {
        "model": "tiny", "input": "1 add 2", "max_output_tokens": 400, "stream": True}
    for _ in range(3):
        with httpx.Client(timeout=120) as client, client.stream("POST", server.base_url + path, json=body) as reply:
            for line in reply.iter_lines():  # generation is under way once a token arrives
                if first_token in line and '"token_ids": []' not in line:
                    break
        # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 60
    while len(_cancelled_spans(server, exporter)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # waits on the server's own record of each cancellation, not on a guess of its length
    assert len(_cancelled_spans(server, exporter)) == 3
    after = _timed(server, _SHORT)
    print(f"short request: {before:.2f} s before, {after:.2f} s after 3 dropped streams")
    assert after < max(2.0, 5 * before), (before, after)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {**_LONG, "stream": False}),
    ("/v1/completions", {"model": "tiny", "prompt": "1 add 2", "n": 64, "max_tokens": 400, "temperature": 1.0}),
])
def test_a_dropped_non_streamed_request_stops_generating(server, path, body):
    """A client that gives up on a plain (non-streamed) reply: its generation ends too, as vLLM's server does."""
    server, exporter = server
    before = min(_timed(server, _SHORT) for _ in range(3))
    for _ in range(3):
        with pytest.raises(httpx.ReadTimeout):  # the client waits 0.5 s for the whole reply, then hangs up
            httpx.post(server.base_url + path, json=body, timeout=httpx.Timeout(5.0, read=0.5))
    deadline = time.monotonic() + 60
    while len(_cancelled_spans(server, exporter)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # the server's own record of each cancellation
    assert len(_cancelled_spans(server, exporter)) == 3
    after = _timed(server, _SHORT)
    print(f"short request: {before:.2f} s before, {after:.2f} s after 3 dropped requests")
    assert after < max(2.0, 5 * before), (before, after)

"""Bad requests to the policy server get 400/413 OpenAI-style errors, and never disturb the others."""

from __future__ import annotations

import concurrent.futures
import socket
import threading

import httpx
import pytest

from spanrl.serving import PolicyServer, ServerConfig

ADMIN_TOKEN = "reload-s3cret"  # the `served` fixture's admin token (conftest.py)
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "what is 1 add 2 ?"}], "max_tokens": 3}


def _post_raw(base: str, path: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(f"{base}{path}", content=content, headers={"content-type": "application/json", **headers},
                      timeout=30)


@pytest.mark.parametrize(
    ("raw", "param", "needle"),
    [
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "1"}], "temperature": NaN}', None,
         "NaN is not a valid JSON number"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "1"}], "top_p": NaN}', None,
         "NaN is not a valid JSON number"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "1"}], "temperature": Infinity, "stream": true}',
         None, "Infinity"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "1"}], "temperature": 1e999}', "temperature",
         "temperature must be a number"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "1"}], "seed": 18446744073709551616}', "seed",
         "seed must be an integer between"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "1"}], "seed": -9223372036854775809}', "seed",
         "seed must be an integer between"),
        (b"[" * 100_000 + b"]" * 100_000, None, "nests deeper than 64 levels"),
        (b'{"a": ' + b"[" * 200 + b"]" * 200 + b"}", None, "nests deeper than 64 levels"),
    ],
    ids=["temperature-nan", "top_p-nan", "stream-infinity", "temperature-1e999", "seed-2^64", "seed-below-int64",
         "nested-100000", "nested-200"],
)
def test_bad_numbers_and_deep_json_are_400_and_the_connection_lives_on(served, raw, param, needle):
    base = served.server.base_url
    with httpx.Client(timeout=30) as client:  # one keep-alive connection for both requests
        reply = client.post(f"{base}/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and needle in error["message"] and error["param"] == param
        assert client.post(f"{base}/v1/chat/completions", json=CHAT).status_code == 200


def test_seed_at_int64_bounds_is_served(served):
    for seed in (2**63 - 1, -(2**63)):
        reply = httpx.post(f"{served.server.base_url}/v1/chat/completions", json={**CHAT, "seed": seed}, timeout=30)
        assert reply.status_code == 200, reply.text


def test_body_over_limit_is_413_before_the_body_is_read(tiny_model_dir):
    config = ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                          max_body_bytes=64 * 1024)
    with PolicyServer(config) as server:
        huge = b'{"model": "tiny", "prompt": "' + b"1 " * 50_000 + b'"}'
        reply = _post_raw(server.base_url, "/v1/completions", huge)
        assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
        assert "65536 bytes" in reply.json()["error"]["message"]
        # Announce 100 MiB but send only the headers: the 413 comes back without waiting for the body.
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 104857600\r\n\r\n")
            head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 413")
        # Chunked bodies (no Content-Length) are cut at the limit too.
        chunks = (b"x" * 16_384 for _ in range(16))
        reply = httpx.post(f"{server.base_url}/v1/completions", content=chunks,
                           headers={"content-type": "application/json"}, timeout=30)
        assert reply.status_code == 413
        assert (httpx.post(f"{server.base_url}/v1/completions",
                           json={"model": "tiny", "prompt": "1 add 2", "max_tokens": 2}, timeout=30).status_code == 200)


def test_big_prompts_do_not_stall_health_or_other_requests(served, monkeypatch):
    """Tokenizing runs off the event loop: while a big prompt's tokenizing is held (a gate in the tokenizer pool's
    thread), /health answers. Tokenizing on the loop would hold the loop too, and /health would not answer until
    the gate opened (the old check compared latencies: heavy-tailed under load)."""
    from spanrl.serving.intake import TokenizerPool

    base = served.server.base_url
    big = {"model": "tiny", "prompt": "1 add 2 " * 60_000, "max_tokens": 1}  # ~480 kB, over the context
    entered, gate = threading.Event(), threading.Event()
    own = TokenizerPool._own

    def held(self):
        entered.set()
        gate.wait(120)  # a hang guard: the test opens it
        return own(self)

    monkeypatch.setattr(TokenizerPool, "_own", held)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reply = pool.submit(httpx.post, f"{base}/v1/completions", json=big, timeout=300)
        try:
            assert entered.wait(120), "the big prompt never reached the tokenizer"
            assert httpx.get(f"{base}/health", timeout=60).status_code == 200  # while tokenizing is held
            assert not reply.done()  # it was still held when /health answered
        finally:
            gate.set()
        answer = reply.result()
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"


_ROUTES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": "tiny", "prompt": "1 add 2", "max_tokens": 2},
    "/v1/responses": {"model": "tiny", "input": "1 add 2", "max_output_tokens": 2},
    "/v1/messages": {"model": "tiny", "messages": [{"role": "user", "content": "1 add 2"}], "max_tokens": 2},
}


@pytest.mark.parametrize("route", [*_ROUTES, "stream", "/v1/weights/reload"])
def test_a_model_that_is_not_a_string_is_a_400_naming_it(served, route):
    """Issue 53, finding 7: ``{"model": ["x"]}`` was a 500 (unhashable type: 'list') on every route and on reload."""
    body = {**_ROUTES.get(route, CHAT), "model": ["x"]}
    if route == "stream":
        route, body["stream"] = "/v1/chat/completions", True
    elif route == "/v1/weights/reload":
        body = {"path": "x", "model": ["x"]}
    reply = httpx.post(served.server.base_url + route, json=body, headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                       timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == "model must be a string naming a served model, got list ['x']"
    assert reply.json()["error"].get("param", "model") == "model"  # Anthropic's error body has no param


_FIELDS = ("model", "messages", "prompt", "input", "max_tokens", "max_completion_tokens", "max_output_tokens",
           "temperature", "top_p", "n", "stop", "stop_sequences", "stream", "logprobs", "top_logprobs", "seed", "tools",
           "tool_choice", "metadata", "conversation", "stream_options", "response_format", "system", "instructions")


@pytest.mark.parametrize("route", list(_ROUTES))
def test_no_malformed_field_is_a_500(served, route):
    """Every field set to a value of the wrong shape: a 4xx (or a reply, where the API ignores the field), never 500."""
    failures = []
    with httpx.Client(timeout=30) as client:
        for field in _FIELDS:
            for bad in (["x"], {"a": [1]}, -1, "x", 1e308):
                reply = client.post(served.server.base_url + route, json={**_ROUTES[route], field: bad})
                if reply.status_code >= 500:
                    failures.append((field, bad, reply.status_code, reply.text[:120]))
    assert failures == []

"""A request without spanrl ids names its conversation the standard ways; the server span records it as
``gen_ai.conversation.id`` beside the caller's trace (the store's attribution rule reads both)."""

from __future__ import annotations

import httpx
import openai
import pytest

from spanrl import semconv

_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
_BODY = {"model": "tiny", "messages": [{"role": "user", "content": "3 add 4"}], "max_tokens": 1}


def _post(served, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{served.server.base_url}/v1/chat/completions", json=body, headers=headers or {}, timeout=30)


def test_conversation_id_from_metadata_conversation_baggage_and_header(served) -> None:
    client = openai.OpenAI(base_url=f"{served.server.base_url}/v1", api_key="unused")
    client.chat.completions.create(**_BODY, metadata={"conversation_id": "c-meta"})  # OpenAI's metadata field
    assert _post(served, {**_BODY, "metadata": {"gen_ai.conversation.id": "c-semconv"}}).status_code == 200
    assert _post(served, {**_BODY, "conversation": {"id": "c-responses"}}).status_code == 200
    traceparent = f"00-{_TRACE}-00f067aa0ba902b7-01"
    assert _post(served, _BODY, {"traceparent": traceparent,
                                 "baggage": "other=1, gen_ai.conversation.id=c%20bag;p=1"}).status_code == 200
    assert _post(served, _BODY, {"x-gen-ai-conversation-id": "c-header"}).status_code == 200
    # the body wins over the headers; spanrl's ids and the conversation are both kept
    assert _post(served, {**_BODY, "metadata": {"conversation_id": "c-body"}},
                 {"x-gen-ai-conversation-id": "c-ignored", "x-spanrl-rollout-id": "r-1"}).status_code == 200
    assert _post(served, _BODY).status_code == 200  # none: nothing recorded

    spans = sorted(served.spans(), key=lambda s: s.start_time)
    got = [(s.attributes.get(semconv.GEN_AI_CONVERSATION_ID), s.attributes.get(semconv.ROLLOUT_ID)) for s in spans]
    assert got == [("c-meta", None), ("c-semconv", None), ("c-responses", None), ("c bag", None),
                   ("c-header", None), ("c-body", "r-1"), (None, None)]
    assert f"{spans[3].context.trace_id:032x}" == _TRACE and spans[3].parent is not None  # the caller's trace
    assert spans[6].parent is None  # no traceparent: a trace of its own (the store keys it by response)


@pytest.mark.parametrize(("body", "param"), [
    ({"metadata": {"conversation_id": 7}}, "metadata.conversation_id"),
    ({"conversation": "x" * 513}, "conversation"),
])
def test_a_conversation_id_that_is_not_a_short_string_is_refused(served, body, param) -> None:
    response = _post(served, {**_BODY, **body})
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert "must be a string of at most 512 characters" in response.json()["error"]["message"]

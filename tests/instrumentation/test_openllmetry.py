"""spanrl's adjustments to OpenLLMetry: same span shape, cheaper, baggage header; undone by unpatch."""

from __future__ import annotations

import json

import openai
import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.openai.shared import chat_wrappers

import spanrl
from fake_openai import FakeOpenAI
from spanrl import semconv
from spanrl.instrumentation import _openllmetry


@pytest.fixture(autouse=True)
def _restore_patch_state():
    """Leave OpenLLMetry as the test found it (other tests in the process may rely on either state)."""
    was_patched = hasattr(chat_wrappers.propagate_trace_context, "_spanrl_original")
    yield
    _openllmetry.unpatch()
    if was_patched:
        _openllmetry.patch()


@pytest.fixture
def wrapper(spans):
    """OpenLLMetry's chat wrapper on the test provider, called like the instrumented client calls it."""
    tracer = trace.get_tracer("test.openllmetry")
    return chat_wrappers.chat_wrapper(tracer, None, None, None, None, None, None)


def _call(wrapper, server: FakeOpenAI, **create: object) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="sk-test")
    completions = client.chat.completions
    wrapper(completions.create, completions, (),
            {"model": "tiny", "messages": [{"role": "user", "content": "2+3?"}], **create})


@pytest.mark.parametrize("patched", [False, True])
def test_span_shape_is_the_same_patched_or_not(spans, wrapper, patched):
    _openllmetry.unpatch()
    if patched:
        assert _openllmetry.patch() > 0
    try:
        with FakeOpenAI(reply="5") as server, spanrl.rollout("r-ol"):
            _call(wrapper, server)
            headers = server.requests[0].headers
    finally:
        _openllmetry.unpatch()
    chat = spans.one("openai.chat")
    attrs = chat.attributes
    assert attrs[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert json.loads(attrs[semconv.GEN_AI_INPUT_MESSAGES])[0]["parts"][0]["content"] == "2+3?"
    assert json.loads(attrs[semconv.GEN_AI_OUTPUT_MESSAGES])[0]["parts"][0]["content"] == "5"
    assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 1 and attrs[semconv.GEN_AI_RESPONSE_ID].startswith("chatcmpl-")
    assert headers["traceparent"].split("-")[2] == format(chat.context.span_id, "016x")
    # Patched: null prompt_tokens_details no longer aborts the usage attributes; rollout ids in baggage.
    assert (attrs.get("gen_ai.usage.cache_read.input_tokens") == 0) is patched
    assert ("spanrl.rollout.id=r-ol" in headers.get("baggage", "")) is patched


def test_unpatch_restores_the_originals():
    before = {name: getattr(chat_wrappers, name)
              for name in ("run_async", "propagate_trace_context", "_set_response_attributes")}
    _openllmetry.patch()
    assert all(getattr(chat_wrappers, name) is not fn for name, fn in before.items())
    assert _openllmetry.patch() == 0  # idempotent
    _openllmetry.unpatch()
    assert all(getattr(chat_wrappers, name) is fn for name, fn in before.items())


def test_speedups_off_keeps_only_the_baggage_header(monkeypatch):
    monkeypatch.setenv("SPANRL_OPENLLMETRY_SPEEDUPS", "0")
    run_async = chat_wrappers.run_async
    try:
        _openllmetry.patch()
        assert chat_wrappers.run_async is run_async
        assert hasattr(chat_wrappers.propagate_trace_context, "_spanrl_original")
    finally:
        _openllmetry.unpatch()


def test_fast_run_async_drives_a_coroutine_and_falls_back_when_it_suspends():
    import asyncio

    done: list[str] = []
    fast = _openllmetry._fast_run_async(lambda coro: done.append("original"))

    async def quick() -> None:
        done.append("quick")

    async def suspends() -> None:
        await asyncio.sleep(0)
        done.append("never")

    fast(quick())
    fast(suspends())  # closed, not run half-way in a loop that does not exist
    assert done == ["quick"]


def test_cached_base_url_follows_a_new_base_url():
    import openai
    from opentelemetry.instrumentation.openai import shared

    original = getattr(shared._get_openai_base_url, "_spanrl_original", shared._get_openai_base_url)
    get = _openllmetry._cached_base_url(original)
    client = openai.OpenAI(base_url="http://a.example:1234/v1", api_key="sk-test")
    assert get(client.chat.completions) == get(client.chat.completions) == "http://a.example:1234/v1/"
    client.base_url = "http://b.example/v2"  # a new URL object: the cache must not answer the old one
    assert get(client.chat.completions) == "http://b.example/v2/"
    assert get(object()) == ""  # not an OpenAI resource: OpenLLMetry's own answer

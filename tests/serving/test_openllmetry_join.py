"""The join the decomposer relies on: the agent's OpenLLMetry client span and the policy server's span
share gen_ai.response.id, and the server span is the client span's child (W3C trace context)."""

from __future__ import annotations

import openai
from opentelemetry.instrumentation.openai.shared import chat_wrappers
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spanrl import semconv


def test_openllmetry_client_span_joins_the_server_span(served) -> None:
    agent_spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(agent_spans))
    wrapper = chat_wrappers.chat_wrapper(provider.get_tracer("agent"), None, None, None, None, None, None)
    client = openai.OpenAI(base_url=served.server.rollout_base_url("r-join"), api_key="unused", max_retries=0)
    completions = client.chat.completions
    resp = wrapper(completions.create, completions, (),
                   {"model": "tiny", "messages": [{"role": "user", "content": "3 add 4"}], "max_tokens": 4})
    (client_span,) = [s for s in agent_spans.get_finished_spans()
                      if s.attributes.get(semconv.GEN_AI_OPERATION_NAME) == "chat"]
    (server_span,) = served.spans()
    assert (client_span.attributes[semconv.GEN_AI_RESPONSE_ID] == server_span.attributes[semconv.GEN_AI_RESPONSE_ID]
            == resp.id)
    assert server_span.context.trace_id == client_span.context.trace_id
    assert server_span.parent is not None and server_span.parent.span_id == client_span.context.span_id
    assert server_span.attributes[semconv.ROLLOUT_ID] == "r-join"

"""Tool call decisions as semantic-conventions-genai records them (model/gen-ai/events.yaml @ a347289: the event
``gen_ai.tool.call.decision``, outcome required, ``gen_ai.tool.call.id`` / ``gen_ai.tool.name`` when known; "a
denied tool call can produce this event without producing an execute_tool span"), shaped as the spec's reference
scenarios emit them (reference/scenarios/agent-framework: require_approval then deny on one proposed call, the
handler never runs; claude-agent-sdk: deny from ``can_use_tool``, no tool span), and the attribute form spanrl
read before. Real spans through an OTLP exporter into a real collector; read back by the views, the step facts,
``step`` credit and the viewer's credit table."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from test_genai_conventions import Template  # a chat template in memory, one id per character

from spanrl import semconv as sc
from spanrl.algorithms.credit import LightningRL
from spanrl.algorithms.transitions import load_transitions
from spanrl.store.decomposer import decompose
from spanrl.store.step_facts import CALL_COLUMNS, step_facts

_ASK = [{"role": "user", "parts": [{"type": "text", "content": "What's the weather in Seattle?"}]}]


def _said(call_id: str, tool: str) -> str:
    return json.dumps([{"role": "assistant", "finish_reason": "tool_call", "parts": [
        {"type": "tool_call", "id": call_id, "name": tool, "arguments": {"location": "Seattle"}}]}])


def _decision(outcome: str, tool: str | None = None, call_id: str | None = None) -> dict[str, str]:
    attributes = {sc.GEN_AI_TOOL_CALL_DECISION_OUTCOME: outcome}
    if tool is not None:
        attributes[sc.GEN_AI_TOOL_NAME] = tool
    if call_id is not None:
        attributes[sc.GEN_AI_TOOL_CALL_ID] = call_id
    return attributes


def _chat(tracer: Any, output: str, events: tuple = (), tokens: bool = False) -> None:
    attributes = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.GEN_AI_INPUT_MESSAGES: json.dumps(_ASK),
                  sc.GEN_AI_OUTPUT_MESSAGES: output}
    if tokens:  # exact ids, as the policy server records them (its SERVER span): the viewer trains on those
        attributes |= {sc.LLM_PROMPT_TOKEN_IDS: [1, 2], sc.LLM_COMPLETION_TOKEN_IDS: [3], sc.LLM_LOGPROBS: [-0.5]}
    kind = SpanKind.SERVER if tokens else SpanKind.CLIENT
    with tracer.start_as_current_span("chat gpt-4o-mini", kind=kind, attributes=attributes) as span:
        for name, attributes in events:
            span.add_event(name, attributes)


def _deliver(collector: Any, tokens: bool = False) -> None:
    """Rollout ``r-deny``, five LLM calls under one invoke_agent span:

    0. proposes ``get_weather`` (call_weather_1); the approval flow records require_approval, then deny, on the
       agent's span (agent-framework's order); no execute_tool span;
    1. answers after the rejection;
    2. proposes ``Bash`` and is denied inside the call (an id-less event on the chat span itself);
    3. proposes ``get_weather`` (call_weather_2): allowed by an event on the agent's span; its execute_tool span
       carries no decision of its own;
    4. a tool span with the old attribute ``gen_ai.tool.call.decision`` = ``deny``.

    Reward 1 at the end.
    """
    resource = Resource.create({"service.name": "weather-agent", sc.ROLLOUT_ID: "r-deny", sc.TASK_ID: "t"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    tracer = provider.get_tracer("agent_framework")
    op, decision = sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_TOOL_CALL_DECISION
    text = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "I may not."}]}])
    with tracer.start_as_current_span("invoke_agent WeatherAgent", attributes={
            op: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "WeatherAgent"}) as agent:
        _chat(tracer, _said("call_weather_1", "get_weather"), tokens=tokens)
        agent.add_event(decision, _decision("require_approval", "get_weather", "call_weather_1"))
        agent.add_event(decision, _decision("deny", "get_weather", "call_weather_1"))
        _chat(tracer, text, tokens=tokens)
        _chat(tracer, _said("toolu_mock_permission_001", "Bash"), events=((decision, _decision("deny", "Bash")),),
              tokens=tokens)
        _chat(tracer, _said("call_weather_2", "get_weather"), tokens=tokens)
        agent.add_event(decision, _decision("allow", "get_weather", "call_weather_2"))
        tracer.start_span("execute_tool get_weather", attributes={
            op: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "get_weather", sc.GEN_AI_TOOL_CALL_ID: "call_weather_2"}).end()
        _chat(tracer, _said("call_rm", "delete_file"), tokens=tokens)
        tracer.start_span("execute_tool delete_file", attributes={
            op: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "delete_file", sc.GEN_AI_TOOL_CALL_ID: "call_rm",
            decision: "deny"}).end()
        agent.add_event(sc.REWARD_SPAN_NAME, {sc.REWARD_VALUE: 1.0})
    provider.shutdown()


def test_decisions_are_read_wherever_the_spec_records_them(collector: Any) -> None:
    _deliver(collector)
    decisions = collector.store.sql("SELECT outcome, tool_call_id, tool_name, on_tool_span, source FROM tool_decisions "
                                    "ORDER BY time_ns").to_pylist()
    assert [tuple(d.values()) for d in decisions] == [
        ("require_approval", "call_weather_1", "get_weather", False, "event"),
        ("deny", "call_weather_1", "get_weather", False, "event"),
        ("deny", None, "Bash", False, "event"),
        ("allow", "call_weather_2", "get_weather", False, "event"),
        ("deny", "call_rm", "delete_file", True, "attribute"),
    ]
    tools = collector.store.sql("SELECT tool_call_id, decision FROM tool_calls ORDER BY start_ns").to_pylist()
    assert tools == [{"tool_call_id": "call_weather_2", "decision": "allow"},  # by its call id, from the agent span
                     {"tool_call_id": "call_rm", "decision": "deny"}]


def test_a_denied_call_without_a_tool_span_is_its_calls_step_signal(collector: Any) -> None:
    _deliver(collector)
    calls = decompose(collector.store, call_columns=CALL_COLUMNS).calls
    assert calls.num_rows == 5
    got = {r["step"]: {k: r[k] for k in ("tools", "tool_error", "nonzero_exit", "denied", "retry") if r[k]}
           for r in step_facts(collector.store, calls).to_pylist()}
    assert got == {0: {"tools": 1, "denied": 1},  # require_approval then deny: the last decision holds, once
                   2: {"tools": 1, "denied": 1},  # recorded on the call's own span, no call id
                   3: {"tools": 1},  # allowed, ran
                   4: {"tools": 1, "denied": 1}}  # the attribute form

    batch = load_transitions(collector.store, credit=LightningRL(mode="step", scale_std=False,
                                                                 step_signals={"denied": -0.5}),
                             tokenizer=Template())
    assert batch.report["step_signal_denied"] == 3
    rewards = {t.step: round(t.reward, 6) for t in batch.transitions}
    # s = [-0.5, 0, -0.5, 0, -0.5], reward 1 after call 4; gamma 1: G_t = 1 + sum of s from t on
    assert rewards == {0: -0.5, 1: 0.0, 2: 0.0, 3: 0.5, 4: 0.5}



def test_the_viewer_shows_the_denials_in_its_credit_table(collector: Any) -> None:
    from spanrl.ui.server import UiServer

    _deliver(collector, tokens=True)
    ui = UiServer.from_args(url=collector.http_endpoint, port=0).start()
    try:
        with urllib.request.urlopen(ui.url.rstrip("/") + "/api/credit?id=r-deny", timeout=30) as resp:
            credit = json.loads(resp.read())
    finally:
        ui.shutdown()
    assert {t["step"]: t["signals"] for t in credit["transitions"]} == {
        0: {"denied": 1}, 1: {}, 2: {"denied": 1}, 3: {}, 4: {"denied": 1}}

"""Rollouts of agents that know nothing of spanrl (store/views.sql's attribution rule), and late feedback in
the GenAI conventions' form, on real spans: an in-process collector, the SDK's OTLP/gRPC exporter, spans
shaped as the policy server and a plain instrumented agent send them."""

from __future__ import annotations

import json
import time
from typing import Any

from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from spanrl import semconv as sc
from spanrl.store.online import Watermark, now_ns, ready_rollouts


def _tracer(collector: Any, service: str) -> Any:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    return provider.get_tracer(service)


def _served(server: Any, response_id: str, question: str, *, parent: Any = None, **attrs: Any) -> None:
    """The policy server's span of one call (child of the caller's span when it sent a traceparent)."""
    messages = json.dumps([{"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
                           {"role": "user", "parts": [{"type": "text", "content": question}]}])
    ctx = trace.set_span_in_context(parent) if parent is not None else context.Context()
    server.start_span("chat policy", context=ctx, kind=SpanKind.SERVER, attributes={
        sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_RESPONSE_ID: response_id, sc.POLICY_VERSION: 0,
        sc.GEN_AI_INPUT_MESSAGES: messages, sc.LLM_PROMPT_TOKEN_IDS: [1, 2], sc.LLM_COMPLETION_TOKEN_IDS: [3],
        sc.LLM_LOGPROBS: [-0.5], **attrs}).end()


def _agent_call(agent: Any, server: Any, response_id: str, question: str, **server_attrs: Any) -> str:
    """A plain agent's chat call (its instrumentor's CLIENT span under a root span); returns the trace id."""
    with agent.start_as_current_span("handle request", context=context.Context()) as root:
        with agent.start_as_current_span("openai.chat", kind=SpanKind.CLIENT,
                                         attributes={sc.GEN_AI_OPERATION_NAME: "chat"}) as client:
            _served(server, response_id, question, parent=client, **server_attrs)
            client.set_attribute(sc.GEN_AI_RESPONSE_ID, response_id)
        return f"{root.get_span_context().trace_id:032x}"


def _rollouts(collector: Any) -> dict[str, dict[str, Any]]:
    rows = collector.store.sql("SELECT rollout_id, task_id, span_count FROM rollouts").to_pylist()
    return {r["rollout_id"]: r for r in rows}


def test_calls_without_ids_belong_to_their_conversation_else_trace_else_response(collector) -> None:
    agent, server = _tracer(collector, "plain-agent"), _tracer(collector, "spanrl-policy")
    conv = {sc.GEN_AI_CONVERSATION_ID: "c-1"}
    _agent_call(agent, server, "chatcmpl-a", "the sky is", **conv)  # two turns of one conversation,
    _agent_call(agent, server, "chatcmpl-b", "and then?", **conv)   # two traces
    trace_c = _agent_call(agent, server, "chatcmpl-c", "the sky is")  # no conversation: its trace
    _served(server, "chatcmpl-d", "the snow is")                      # no traceparent either: the response
    _agent_call(agent, server, "chatcmpl-e", "the sky is", **{sc.ROLLOUT_ID: "r-own"})  # spanrl's ids still win
    with agent.start_as_current_span("two conversations", context=context.Context(),
                                     attributes={sc.GEN_AI_CONVERSATION_ID: "c-2"}) as root:
        _served(server, "chatcmpl-f", "the sky is", parent=root, **{sc.GEN_AI_CONVERSATION_ID: "c-3"})
    with agent.start_as_current_span("no policy server call", context=context.Context()):
        pass

    rollouts = _rollouts(collector)
    assert set(rollouts) == {"conversation:c-1", f"trace:{trace_c}", "response:chatcmpl-d", "r-own"}
    assert rollouts["conversation:c-1"]["span_count"] == 6  # both traces, the agent's spans and the server's
    assert rollouts[f"trace:{trace_c}"]["span_count"] == 3
    # The task: the first user message's hash, so one question asked twice is one baseline group.
    assert rollouts["conversation:c-1"]["task_id"] == rollouts[f"trace:{trace_c}"]["task_id"]
    assert rollouts["conversation:c-1"]["task_id"].startswith("user:")
    assert rollouts["response:chatcmpl-d"]["task_id"] not in (None, rollouts[f"trace:{trace_c}"]["task_id"])
    calls = collector.store.sql("SELECT rollout_id, count(*) AS n FROM llm_calls GROUP BY 1").to_pylist()
    assert {r["rollout_id"]: r["n"] for r in calls}["conversation:c-1"] == 4  # client + server, two turns


def test_evaluation_results_keyed_by_response_are_late_feedback_latest_wins(collector) -> None:
    agent, server = _tracer(collector, "plain-agent"), _tracer(collector, "spanrl-policy")
    users = _tracer(collector, "users")
    trace_1 = _agent_call(agent, server, "chatcmpl-1", "the sky is")
    _agent_call(agent, server, "chatcmpl-2", "the grass is", **{sc.GEN_AI_CONVERSATION_ID: "c-2"})
    _agent_call(agent, server, "chatcmpl-3", "the snow is")  # never judged

    def evaluation(value: float, response_id: str, *, as_event: bool = True) -> None:
        attrs = {sc.GEN_AI_EVALUATION_NAME: "thumbs", sc.GEN_AI_EVALUATION_SCORE_VALUE: value,
                 sc.GEN_AI_RESPONSE_ID: response_id}
        span = users.start_span("user verdict", context=context.Context(), attributes={} if as_event else attrs)
        if as_event:
            span.add_event(sc.GEN_AI_EVALUATION_RESULT_EVENT, attrs)
        span.end()

    evaluation(0.0, "chatcmpl-1")
    time.sleep(0.01)
    evaluation(1.0, "chatcmpl-1")  # changed their mind: the latest stored wins
    evaluation(0.5, "chatcmpl-2", as_event=False)  # the span form
    evaluation(1.0, "chatcmpl-unknown")  # judges no rollout: ignored

    ready = ready_rollouts(collector.store, Watermark(), now=now_ns(collector.store), settle_s=0.0, max_age_s=30.0,
                           horizon_ns=0, quiet_s=0.0)
    by_id = {r.rollout_id: r for r in ready}
    assert set(by_id) == {f"trace:{trace_1}", "conversation:c-2"}
    assert (by_id[f"trace:{trace_1}"].reward, by_id[f"trace:{trace_1}"].feedback_count) == (1.0, 2)
    assert (by_id["conversation:c-2"].reward, by_id["conversation:c-2"].feedback_count) == (0.5, 1)
    assert by_id["conversation:c-2"].task_id.startswith("user:") and by_id["conversation:c-2"].token_calls == 1


def test_task_derivation_follows_spanrl_task_from(tmp_path, monkeypatch, caplog) -> None:
    from spanrl.collector import Collector, CollectorConfig

    tasks = {}
    for setting in ("input_messages", "none", "bogus"):
        monkeypatch.setenv("SPANRL_TASK_FROM", setting)
        collector = Collector(CollectorConfig(db_path=str(tmp_path / f"{setting}.duckdb"), grpc_port=0,
                                              http_port=0)).start()
        try:
            _served(_tracer(collector, "spanrl-policy"), "chatcmpl-1", "the sky is")
            tasks[setting] = _rollouts(collector)["response:chatcmpl-1"]["task_id"]
        finally:
            collector.shutdown()
    assert tasks["input_messages"].startswith("input:") and tasks["none"] is None
    assert tasks["bogus"].startswith("user:")  # a bad value: the default, with a warning naming the choices
    assert "SPANRL_TASK_FROM='bogus' is not one of first_user_message, input_messages, none" in caplog.text


def test_a_conversation_cut_off_before_its_answer_has_no_task_and_never_trains(collector) -> None:
    """The policy server records a call whose client went away (or whose generation failed) as one ERROR span
    with the response id and the conversation id but no content and no tokens (serving/responses.py): such a
    conversation is a rollout with no task to derive (its question was never recorded) and nothing to train
    (no answer reached a user to judge, no tokens). One whose cut-off call was retried and answered takes its
    task from the answered call, like any other."""
    from opentelemetry.trace import Status, StatusCode

    agent, server = _tracer(collector, "plain-agent"), _tracer(collector, "spanrl-policy")

    def cut_off(response_id: str, conversation: str) -> None:
        span = server.start_span("chat policy", context=context.Context(), kind=SpanKind.SERVER, attributes={
            sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_RESPONSE_ID: response_id, sc.POLICY_VERSION: 0,
            sc.GEN_AI_CONVERSATION_ID: conversation})
        span.set_status(Status(StatusCode.ERROR, "the client disconnected: generation cancelled"))
        span.end()

    cut_off("chatcmpl-1", "stopped")
    cut_off("chatcmpl-2", "retried")
    _agent_call(agent, server, "chatcmpl-3", "the sky is", **{sc.GEN_AI_CONVERSATION_ID: "retried"})
    _agent_call(agent, server, "chatcmpl-4", "the sky is", **{sc.GEN_AI_CONVERSATION_ID: "answered"})
    users = _tracer(collector, "users")
    for response_id in ("chatcmpl-3", "chatcmpl-4"):  # the users judge the answers they got
        users.start_span("user verdict", context=context.Context(), attributes={
            sc.GEN_AI_EVALUATION_NAME: "thumbs", sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0,
            sc.GEN_AI_RESPONSE_ID: response_id}).end()

    rows = collector.store.sql("SELECT rollout_id, task_id, status, error_count FROM rollouts").to_pylist()
    by_id = {r["rollout_id"]: r for r in rows}
    assert set(by_id) == {"conversation:stopped", "conversation:retried", "conversation:answered"}
    assert (by_id["conversation:stopped"]["task_id"], by_id["conversation:stopped"]["error_count"]) == (None, 1)
    assert by_id["conversation:retried"]["task_id"] == by_id["conversation:answered"]["task_id"]
    assert by_id["conversation:answered"]["task_id"].startswith("user:")
    ready = ready_rollouts(collector.store, Watermark(), now=now_ns(collector.store), settle_s=0.0, max_age_s=30.0,
                           horizon_ns=0, quiet_s=0.0)
    assert {(r.rollout_id, r.task_id, r.token_calls) for r in ready} == {
        ("conversation:retried", by_id["conversation:answered"]["task_id"], 1),
        ("conversation:answered", by_id["conversation:answered"]["task_id"], 1)}

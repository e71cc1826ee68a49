"""GenAI events sent as OTLP log records, as semantic-conventions-genai's reference scenarios emit them (an event
logger's ``emit(event_name=..., attributes=...)``, in the context of the span concerned or of none): the
collector's /v1/logs (HTTP) and LogsService (gRPC) store each as a span of its own, and every reader finds it where
it finds the span event: a tool decision (agent-framework: require_approval then deny inside the agent; claude-agent-
sdk: a deny with no span active), a call's messages on the inference-details event, an upload's storage result,
an evaluation result. Real OTel SDK log and span exporters into a real collector."""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from spanrl import semconv as sc
from spanrl.store.decomposer import decompose
from spanrl.store.step_facts import CALL_COLUMNS, step_facts

_ASK = [{"role": "user", "parts": [{"type": "text", "content": "What's the weather in Seattle?"}]}]
_ANSWER = [{"role": "assistant", "parts": [{"type": "text", "content": "Rainy."}], "finish_reason": "stop"}]


def _said(call_id: str, tool: str) -> str:
    return json.dumps([{"role": "assistant", "finish_reason": "tool_call", "parts": [
        {"type": "tool_call", "id": call_id, "name": tool, "arguments": {"location": "Seattle"}}]}])


def _providers(collector: Any, over_grpc: bool) -> tuple[TracerProvider, LoggerProvider]:
    resource = Resource.create({"service.name": "weather-agent", sc.ROLLOUT_ID: "r-logs", sc.TASK_ID: "t"})
    tracing = TracerProvider(resource=resource)
    tracing.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    logging_ = LoggerProvider(resource=resource)
    exporter = (GrpcLogExporter(endpoint=collector.grpc_endpoint, insecure=True) if over_grpc
                else HttpLogExporter(endpoint=collector.http_endpoint.rstrip("/") + "/v1/logs"))
    logging_.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    return tracing, logging_


def _deliver(collector: Any, over_grpc: bool) -> None:
    """Rollout ``r-logs``, four chat calls under an invoke_agent span; the events are log records:

    0. proposes get_weather (call_w1): require_approval, then deny, emitted inside the agent's span;
    1. proposes Bash (toolu_mock_permission_001): denied from a permission callback with no span active;
    2. its messages only on an inference-details record emitted inside the call's span;
    3. no messages: its input was to be uploaded, and the upload reports it dropped.
    Then an evaluation result (0.625) inside the agent's span.
    """
    tracing, logging_ = _providers(collector, over_grpc)
    tracer, events = tracing.get_tracer("agent_framework"), logging_.get_logger("gen_ai.reference")
    decision = "gen_ai.tool.call.decision"
    chat = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}
    with tracer.start_as_current_span("invoke_agent WeatherAgent", attributes={
            sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "WeatherAgent"}):
        tracer.start_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes={
            **chat, sc.GEN_AI_INPUT_MESSAGES: json.dumps(_ASK),
            sc.GEN_AI_OUTPUT_MESSAGES: _said("call_w1", "get_weather")}).end()
        for outcome in ("require_approval", "deny"):
            events.emit(event_name=decision, body=f"Tool call {outcome}", attributes={
                sc.GEN_AI_TOOL_CALL_DECISION_OUTCOME: outcome, sc.GEN_AI_TOOL_NAME: "get_weather",
                sc.GEN_AI_TOOL_CALL_ID: "call_w1"})
        tracer.start_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes={
            **chat, sc.GEN_AI_INPUT_MESSAGES: json.dumps(_ASK),
            sc.GEN_AI_OUTPUT_MESSAGES: _said("toolu_mock_permission_001", "Bash")}).end()
        with tracer.start_as_current_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes=chat):
            events.emit(event_name=sc.GEN_AI_INFERENCE_DETAILS_EVENT, attributes={
                sc.GEN_AI_INPUT_MESSAGES: json.dumps(_ASK), sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(_ANSWER)})
        with tracer.start_as_current_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes=chat):
            events.emit(event_name=sc.GEN_AI_CONTENT_STORAGE_RESULT_EVENT, attributes={
                sc.GEN_AI_INPUT_MESSAGES_REF: "file:///uploads/in.json", sc.GEN_AI_CONTENT_STORAGE_STATUS: "dropped"})
        events.emit(event_name=sc.GEN_AI_EVALUATION_RESULT_EVENT, attributes={
            sc.GEN_AI_EVALUATION_NAME: "Relevance", sc.GEN_AI_EVALUATION_SCORE_VALUE: 0.625})
    tracing.shutdown()
    from opentelemetry import context

    token = context.attach(context.Context())  # no span active: the claude-agent-sdk permission callback
    try:
        events.emit(event_name=decision, body="Tool call denied", attributes={
            sc.GEN_AI_TOOL_CALL_DECISION_OUTCOME: "deny", sc.GEN_AI_TOOL_NAME: "Bash",
            sc.GEN_AI_TOOL_CALL_ID: "toolu_mock_permission_001"})
    finally:
        context.detach(token)
    logging_.shutdown()


def _check(collector: Any, caplog: Any) -> None:
    with caplog.at_level(logging.WARNING, logger="spanrl.store.messages"):
        dec = decompose(collector.store, call_columns=None, kept=False)
    calls = dec.calls.to_pylist()
    assert len(calls) == 4 and {c["rollout_id"] for c in calls} == {"r-logs"}
    assert (json.loads(calls[2]["input_messages"]), json.loads(calls[2]["output_messages"])) == (_ASK, _ANSWER)
    assert calls[3]["input_messages"] is None
    assert "input_messages_ref 'file:///uploads/in.json': the upload reported it dropped" in caplog.text
    facts = step_facts(collector.store, dec.calls.select(list(CALL_COLUMNS)))
    assert {r["step"]: r["denied"] for r in facts.to_pylist()} == {0: 1, 1: 1}
    decisions = collector.store.sql("SELECT outcome, tool_call_id FROM tool_decisions ORDER BY time_ns").to_pylist()
    assert [(d["outcome"], d["tool_call_id"]) for d in decisions] == [
        ("require_approval", "call_w1"), ("deny", "call_w1"), ("deny", "toolu_mock_permission_001")]
    rollout = collector.store.sql("SELECT final_reward FROM rollouts WHERE rollout_id = 'r-logs'").to_pylist()
    assert rollout == [{"final_reward": 0.625}]
    llm = collector.store.sql("SELECT input_messages FROM llm_calls ORDER BY start_ns").to_pylist()
    assert json.loads(llm[2]["input_messages"]) == _ASK


def test_events_sent_as_log_records_over_http_are_read_as_span_events(collector: Any, caplog: Any) -> None:
    _deliver(collector, over_grpc=False)
    _check(collector, caplog)


def test_events_sent_as_log_records_over_grpc_are_read_as_span_events(collector: Any, caplog: Any) -> None:
    _deliver(collector, over_grpc=True)
    _check(collector, caplog)


def test_a_plain_log_record_is_refused_by_name_and_an_event_kept(collector: Any) -> None:
    """A log record without an event name is no GenAI event: counted as rejected, with the reason; OTLP/JSON
    (hex ids) and protobuf alike."""
    record = {"timeUnixNano": "1700000000000000000", "traceId": "0af7651916cd43dd8448eb211c80319c",
              "spanId": "b7ad6b7169203331", "eventName": sc.GEN_AI_TOOL_CALL_DECISION,
              "attributes": [{"key": sc.GEN_AI_TOOL_CALL_DECISION_OUTCOME, "value": {"stringValue": "allow"}}]}
    plain = {"timeUnixNano": "1700000000000000001", "body": {"stringValue": "hello"}}
    doc = {"resourceLogs": [{"resource": {"attributes": [
        {"key": sc.ROLLOUT_ID, "value": {"stringValue": "r-json"}}]}, "scopeLogs": [{"logRecords": [record, plain]}]}]}
    url = collector.http_endpoint.rstrip("/") + "/v1/logs"
    request = urllib.request.Request(url, json.dumps(doc).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        reply = json.loads(resp.read())
    assert reply["partialSuccess"]["rejectedLogRecords"] == "1"
    assert "without an event name" in reply["partialSuccess"]["errorMessage"]
    assert collector.store.sql("SELECT rollout_id, outcome, span_id FROM tool_decisions").to_pylist() == [
        {"rollout_id": "r-json", "outcome": "allow", "span_id": "b7ad6b7169203331"}]  # on the span it concerns

    body = ExportLogsServiceRequest()
    body.resource_logs.add().scope_logs.add().log_records.add().body.string_value = "plain"
    request = urllib.request.Request(url, body.SerializeToString(), {"content-type": "application/x-protobuf"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        response = ExportLogsServiceResponse.FromString(resp.read())
    assert response.partial_success.rejected_log_records == 1

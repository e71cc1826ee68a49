"""The OTel SDK's own exporters, against `spanrl collector` started as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from spanrl import semconv as sc


def _emit(exporter, service: str) -> None:
    provider = TracerProvider(
        resource=Resource.create({sc.SERVICE_NAME: service, sc.ROLLOUT_ID: f"ro-{service}", sc.TASK_ID: "t7"})
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.exporters")
    with tracer.start_as_current_span("invoke_agent solver", attributes={sc.GEN_AI_OPERATION_NAME: "invoke_agent",
                                                                         sc.GEN_AI_AGENT_NAME: "solver"}):
        with tracer.start_as_current_span(
            "chat tiny",
            kind=SpanKind.CLIENT,
            attributes={
                sc.GEN_AI_OPERATION_NAME: "chat",
                sc.GEN_AI_REQUEST_MODEL: "tiny",
                sc.GEN_AI_RESPONSE_ID: f"resp-{service}",
                sc.LLM_PROMPT_TOKEN_IDS: [5, 6, 7],
                sc.LLM_COMPLETION_TOKEN_IDS: [8, 9],
                sc.LLM_LOGPROBS: [-0.5, -0.25],
                sc.GEN_AI_REQUEST_TEMPERATURE: 0.7,
                "tags": ["a", "b"],
                "flag": True,
            },
        ) as span:
            span.add_event(sc.REWARD_SPAN_NAME, {sc.REWARD_VALUE: 0.75, sc.REWARD_NAME: "accuracy"})
    provider.shutdown()


def _cli_sql(proc, query: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "spanrl", "sql", query, "--url", proc.http_endpoint, "--db", str(proc.db_path),
         "--format", "json"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    return json.loads(out.stdout)


def _check_store(proc, service: str) -> None:
    rows = _cli_sql(proc, f"SELECT * FROM spans WHERE service_name = '{service}' ORDER BY start_ns")
    assert [r["name"] for r in rows] == ["invoke_agent solver", "chat tiny"]
    agent, chat = rows
    assert chat["parent_span_id"] == agent["span_id"] and agent["parent_span_id"] is None
    assert chat["trace_id"] == agent["trace_id"] and len(chat["trace_id"]) == 32
    assert (chat["rollout_id"], chat["task_id"], chat["kind"]) == (f"ro-{service}", "t7", "CLIENT")
    assert (chat["operation_name"], chat["response_id"], agent["agent_name"]) == ("chat", f"resp-{service}", "solver")
    assert chat["prompt_token_ids"] == [5, 6, 7] and chat["completion_token_ids"] == [8, 9]
    assert chat["logprobs"] == [-0.5, -0.25]
    attributes = json.loads(chat["attributes"])
    assert (attributes == {sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "tiny",
                           sc.GEN_AI_RESPONSE_ID: f"resp-{service}", sc.GEN_AI_REQUEST_TEMPERATURE: 0.7,
                           "tags": ["a", "b"], "flag": True})
    events = json.loads(chat["events"])
    assert (events[0]["name"] == sc.REWARD_SPAN_NAME and events[0]["attributes"]
            == {sc.REWARD_VALUE: 0.75, sc.REWARD_NAME: "accuracy"})
    assert json.loads(chat["resource"])[sc.SERVICE_NAME] == service
    rewards = _cli_sql(proc, f"SELECT name, value, source FROM rewards WHERE rollout_id = 'ro-{service}'")
    assert rewards == [{"name": "accuracy", "value": 0.75, "source": "event"}]


def test_grpc_exporter_spans_reach_spanrl_sql(collector_proc):
    _emit(GrpcExporter(endpoint=collector_proc.grpc_endpoint, insecure=True), "grpc-agent")
    _check_store(collector_proc, "grpc-agent")


def test_http_protobuf_exporter_spans_reach_spanrl_sql(collector_proc):
    _emit(HttpExporter(endpoint=f"{collector_proc.http_endpoint}/v1/traces"), "http-agent")
    _check_store(collector_proc, "http-agent")


def test_spanrl_sql_reads_file_after_sigterm(collector_proc):
    _emit(GrpcExporter(endpoint=collector_proc.grpc_endpoint, insecure=True), "grpc-agent")
    assert collector_proc.terminate() == 0
    # No collector answers now: the CLI opens the file itself, read-only.
    rows = _cli_sql(collector_proc, "SELECT count(*) AS n, count(prompt_token_ids) AS with_ids FROM spans")
    assert rows == [{"n": 2, "with_ids": 1}]

"""OTLP logs -> OTLP traces: the GenAI events an instrumentation records through the Logs API, stored as the span
events every reader of the store already reads.

semantic-conventions-genai's events (``gen_ai.tool.call.decision``, ``gen_ai.content.storage.result``,
``gen_ai.client.inference.operation.details``, ``gen_ai.evaluation.result``) are log records with an event name;
its reference instrumentations emit them with an event logger, in the context of the span they concern, or with
none. Each such record becomes a span of its own, so that it goes through the same admission, sender and reward
checks, rollout attribution and retention as any span:

- name: the event name (``LogRecord.event_name``, else the record's ``event.name`` attribute);
- trace and parent: the record's trace id and span id (the span it was emitted in); a record with no trace
  context gets a trace of its own, derived from its bytes (its rollout then comes from its resource);
- span id: derived from the record's bytes and its resource, so a record exported twice is one span;
- start = end = the record's time (else its observed time); attribute ``spanrl.event.log_record`` = true;
- one span event of the same name and time holding the record's attributes.

Readers that look for an event on the span it concerns (a call's details, its upload results, a decision on a
call's span) also look at these spans' events, under the span that is their parent (store/views.sql,
store/decomposer.sql). A record without an event name is a plain log, not a GenAI event: not stored, and counted
as rejected with the reason (OTLP partial success), so the sender sees it.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson
from google.protobuf import json_format

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from spanrl.collector.errors import PermanentError
from spanrl.collector.otlp_json import hex_to_b64, json_object, list_field
from spanrl.collector.tokens import BadSpan
from spanrl.semconv import LOG_RECORD_EVENT

__all__ = ["decode_logs", "logs_json_as_traces", "logs_response"]

_EVENT_NAME = "event.name"  # the attribute older SDKs put the event name in
_PLAIN_LOGS = "a log record without an event name is not a GenAI event; spanrl stores events only"


def _event_name(record: LogRecord) -> str:
    if record.event_name:
        return record.event_name
    for kv in record.attributes:
        if kv.key == _EVENT_NAME and kv.value.HasField("string_value"):
            return kv.value.string_value
    return ""


def _span(record: LogRecord, name: str, resource: bytes) -> Span:
    digest = hashlib.sha256(resource + record.SerializeToString(deterministic=True)).digest()
    time_ns = record.time_unix_nano or record.observed_time_unix_nano
    traced = len(record.trace_id) == 16 and any(record.trace_id)
    span = Span(trace_id=record.trace_id if traced else digest[8:24], span_id=digest[:8], name=name,
                kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=time_ns, end_time_unix_nano=time_ns)
    if traced and len(record.span_id) == 8 and any(record.span_id):
        span.parent_span_id = record.span_id
    marker = span.attributes.add()
    marker.key, marker.value.bool_value = LOG_RECORD_EVENT, True
    event = span.events.add()
    event.name, event.time_unix_nano = name, time_ns
    event.attributes.extend(kv for kv in record.attributes if kv.key != _EVENT_NAME)
    return span


def logs_to_traces(request: ExportLogsServiceRequest) -> tuple[ExportTraceServiceRequest, int]:
    """The trace request holding ``request``'s events as spans (module docstring), and how many records were
    left out (no event name)."""
    out, skipped = ExportTraceServiceRequest(), 0
    for resource_logs in request.resource_logs:
        resource_spans = out.resource_spans.add()
        resource_spans.resource.CopyFrom(resource_logs.resource)
        resource = resource_logs.resource.SerializeToString(deterministic=True)
        for scope_logs in resource_logs.scope_logs:
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.CopyFrom(scope_logs.scope)
            for record in scope_logs.log_records:
                if name := _event_name(record):
                    scope_spans.spans.append(_span(record, name, resource))
                else:
                    skipped += 1
    return out, skipped


def decode_logs(body: bytes, *, as_json: bool) -> tuple[bytes, int, str]:
    """An OTLP logs body (protobuf, or OTLP/JSON with hex ids) as the bytes of the equivalent trace request, the
    number of records left out and why. Raises `PermanentError` for a body that is not a logs request."""
    if as_json:
        request = _from_json(body)
    else:
        request = ExportLogsServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise PermanentError(f"malformed ExportLogsServiceRequest: {exc}") from None
    traces, skipped = logs_to_traces(request)
    return traces.SerializeToString(), skipped, _PLAIN_LOGS if skipped else ""


def _from_json(body: bytes) -> ExportLogsServiceRequest:
    """OTLP/JSON logs: ids are hex there, base64 in protobuf's JSON mapping; a bad id rejects the request."""
    doc = json_object(body, "resourceLogs")
    for resource_logs in list_field(doc, "resourceLogs", "resource_logs"):
        for scope_logs in list_field(resource_logs, "scopeLogs", "scope_logs"):
            for record in list_field(scope_logs, "logRecords", "log_records"):
                _fix_ids(record)
    try:
        return json_format.ParseDict(doc, ExportLogsServiceRequest(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise PermanentError(f"invalid OTLP/JSON ExportLogsServiceRequest: {exc}") from None


def _fix_ids(record: Any) -> None:
    if not isinstance(record, dict):
        raise PermanentError(f"invalid OTLP/JSON: a log record must be an object, got {type(record).__name__}")
    for field in ("traceId", "spanId", "trace_id", "span_id"):
        if record.get(field):
            try:
                record[field] = hex_to_b64(record[field], field)
            except BadSpan as exc:
                raise PermanentError(f"invalid OTLP/JSON log record: {exc}") from None
        else:
            record.pop(field, None)


def logs_json_as_traces(doc: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """An OTLP/JSON logs request (a line of the OpenTelemetry Collector's file exporter) as the OTLP/JSON trace
    request of the spans the collector makes of it (hex ids, the same span ids as live ingest), and how many
    records were left out (no event name). For ``spanrl store import``, which skips spans already stored."""
    body, skipped, _ = decode_logs(orjson.dumps(doc), as_json=True)
    out = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body))
    for resource_spans in out.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for field in ("traceId", "spanId", "parentSpanId"):
                    if field in span:
                        span[field] = base64.b64decode(span[field]).hex()
    return out, skipped


def logs_response(rejected: int, message: str) -> ExportLogsServiceResponse:
    """The OTLP logs reply: partial success when records were left out or rejected."""
    response = ExportLogsServiceResponse()
    if rejected:
        response.partial_success.rejected_log_records = rejected
        response.partial_success.error_message = message
    return response


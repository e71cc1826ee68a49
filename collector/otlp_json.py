"""OTLP/JSON trace requests -> `ExportTraceServiceRequest` (protobuf), for the same walk as protobuf bodies.

OTLP/JSON differs from protobuf's JSON mapping in its ids (hex, not base64), so the ids are rewritten
first; a span with a bad hex id is dropped alone and counted (OTLP partial success).
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from spanrl.collector.errors import PermanentError
from spanrl.collector.tokens import BadSpan

__all__ = ["MAX_ERRORS_REPORTED", "decode_json_request"]

MAX_ERRORS_REPORTED = 5
"""Rejected spans whose reason is quoted in the reply; the rest are counted."""


def _hex_to_b64(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise BadSpan(f"{field} must be a hex string, got {type(value).__name__}")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise BadSpan(f"{field} {value[:40]!r} is not hex") from None
    return base64.b64encode(raw).decode("ascii")


def _fix_span_ids(span: dict[str, Any]) -> None:
    for field in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"):
        if field in span:
            span[field] = _hex_to_b64(span[field], field)
    for link in span.get("links") or ():
        if isinstance(link, dict):
            for field in ("traceId", "spanId", "trace_id", "span_id"):
                if field in link:
                    link[field] = _hex_to_b64(link[field], f"links.{field}")


def decode_json_request(body: bytes) -> tuple[ExportTraceServiceRequest, int, list[str]]:
    """Parse an OTLP/JSON body (hex ids, int64 as strings or numbers, integer enums, unknown fields ignored).

    Returns the request, the number of spans dropped for bad hex ids, and their messages. A body that is
    not JSON, or not an ExportTraceServiceRequest, raises `PermanentError`.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PermanentError(f"malformed OTLP/JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PermanentError(f"OTLP/JSON body must be an object with resourceSpans, got {type(doc).__name__}")
    rejected = 0
    errors: list[str] = []
    index = -1
    for rs in _list_field(doc, "resourceSpans", "resource_spans"):
        for ss in _list_field(rs, "scopeSpans", "scope_spans"):
            spans = _list_field(ss, "spans")
            kept = []
            for span in spans:
                index += 1
                try:
                    if not isinstance(span, dict):
                        raise BadSpan(f"must be an object, got {type(span).__name__}")
                    _fix_span_ids(span)
                    kept.append(span)
                except BadSpan as exc:
                    rejected += 1
                    if len(errors) < MAX_ERRORS_REPORTED:
                        name = span.get("name") if isinstance(span, dict) else None
                        errors.append(f"span {index} ({name!r}): {exc}")
            if isinstance(ss, dict) and "spans" in ss:
                ss["spans"] = kept
    try:
        request = json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise PermanentError(f"invalid OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    return request, rejected, errors


def _list_field(obj: Any, *names: str) -> list[Any]:
    if not isinstance(obj, dict):
        raise PermanentError(f"invalid OTLP/JSON: expected an object, got {type(obj).__name__}")
    for name in names:
        if name in obj:
            value = obj[name]
            if value is None:
                return []
            if not isinstance(value, list):
                raise PermanentError(f"invalid OTLP/JSON: {name} must be an array, got {type(value).__name__}")
            return value
    return []

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

__all__ = ["MAX_ERRORS_REPORTED", "decode_json_request", "hex_to_b64", "json_object", "list_field"]

MAX_ERRORS_REPORTED = 5
"""Rejected spans whose reason is quoted in the reply; the rest are counted."""


def hex_to_b64(value: Any, field: str) -> str:
    """An OTLP/JSON hex id as protobuf's JSON mapping wants it (base64); a bad one is a `BadSpan` naming ``field``."""
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
            span[field] = hex_to_b64(span[field], field)
    for link in span.get("links") or ():
        if isinstance(link, dict):
            for field in ("traceId", "spanId", "trace_id", "span_id"):
                if field in link:
                    link[field] = hex_to_b64(link[field], f"links.{field}")


def json_object(body: bytes, field: str) -> dict[str, Any]:
    """An OTLP/JSON body as its top-level object (whose ``field`` holds the payload); anything else is a
    `PermanentError` naming what was wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PermanentError(f"malformed OTLP/JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PermanentError(f"OTLP/JSON body must be an object with {field}, got {type(doc).__name__}")
    return doc


def decode_json_request(body: bytes) -> tuple[ExportTraceServiceRequest, int, list[str]]:
    """Parse an OTLP/JSON body (hex ids, int64 as strings or numbers, integer enums, unknown fields ignored).

    Returns the request, the number of spans dropped for bad hex ids, and their messages. A body that is
    not JSON, or not an ExportTraceServiceRequest, raises `PermanentError`.
    """
    doc = json_object(body, "resourceSpans")
    rejected = 0
    errors: list[str] = []
    index = -1
    for rs in list_field(doc, "resourceSpans", "resource_spans"):
        for ss in list_field(rs, "scopeSpans", "scope_spans"):
            spans = list_field(ss, "spans")
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


def list_field(obj: Any, *names: str) -> list[Any]:
    """The list under the first of ``names`` (camelCase, then snake_case) in an OTLP/JSON object; [] when absent."""
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

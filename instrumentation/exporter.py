"""A faster OTLP/gRPC span exporter for the agent process: same wire bytes' meaning, less CPU.

The SDK's exporter builds one protobuf object per span, attribute and value in Python before
serialising (``encode_spans``); for an LLM span with a dozen attributes that costs more than the
instrumentation itself, on the agent's CPU. ``encode_request`` writes the protobuf wire format of
``ExportTraceServiceRequest`` directly, with the resource, scope and attribute keys encoded once and
cached. ``FastOTLPSpanExporter`` is the SDK's ``OTLPSpanExporter`` (same retries, headers, compression,
TLS, endpoint variables) with that encoder and a stub that sends the bytes as they are.

Decoded, the request equals ``encode_spans(spans)`` (a test checks it field by field).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["FastOTLPSpanExporter", "encode_request"]

_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_CACHE_MAX_ENTRIES = 4096
_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_U64 = (1 << 64) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

_pack_q = struct.Struct("<Q").pack
_pack_d = struct.Struct("<d").pack
_pack_i = struct.Struct("<I").pack


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes([i]) for i in range(0x80)]


def _ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 0x80 else _varint(n)) + payload


def _string(tag: bytes, text: str) -> bytes:
    return _ld(tag, text.encode("utf-8")) if text else b""


# --- AnyValue / KeyValue -------------------------------------------------------------------------


def _any_value(value: Any) -> bytes:
    # Oneof members are written even when they hold their type's default (False, 0, "").
    if isinstance(value, str):
        return _ld(b"\x0a", value.encode("utf-8"))
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise OverflowError(f"{value} does not fit in int64")
        return b"\x18" + _varint(value & _U64)
    if isinstance(value, float):
        return b"\x21" + _pack_d(value)
    if value is None:
        return b""
    if isinstance(value, bytes):
        return _ld(b"\x3a", value)
    if isinstance(value, Sequence):
        return _ld(b"\x2a", b"".join([_ld(b"\x0a", _any_value(v)) for v in value]))
    if isinstance(value, Mapping):
        return _ld(b"\x32", b"".join([_ld(b"\x0a", _key_value(str(k), v)) for k, v in value.items()]))
    raise TypeError(f"cannot encode attribute value of type {type(value).__name__}")


_key_cache: dict[str, bytes] = {}


def _key_value(key: str, value: Any) -> bytes:
    head = _key_cache.get(key)
    if head is None:
        head = _string(b"\x0a", key)
        if len(_key_cache) < _CACHE_MAX_ENTRIES:
            _key_cache[key] = head
    return head + _ld(b"\x12", _any_value(value))


def _plain(attributes: Any) -> Any:
    """The dict behind the SDK's ``BoundedAttributes`` (iterating that takes a lock per item)."""
    return getattr(attributes, "_dict", attributes)


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    if not attributes:
        return []
    out = []
    small = _SMALL
    for key, value in _plain(attributes).items():
        head = _key_cache.get(key)
        if head is None:
            head = _string(b"\x0a", key)
            if len(_key_cache) < _CACHE_MAX_ENTRIES:
                _key_cache[key] = head
        kind = type(value)
        if kind is str:
            raw = value.encode("utf-8")
            n = len(raw)
            av = b"\x0a" + (small[n] if n < 0x80 else _varint(n)) + raw
        elif kind is float:
            av = b"\x21" + _pack_d(value)
        elif kind is int and 0 <= value < 0x80:  # token counts, ports, steps: one byte
            av = b"\x18" + small[value]
        else:
            try:
                av = _any_value(value)
            except Exception:  # as the SDK encoder: skip the one attribute, keep the span
                continue
        n = len(av)
        kv = head + b"\x12" + (small[n] if n < 0x80 else _varint(n)) + av
        n = len(kv)
        out.append(tag + (small[n] if n < 0x80 else _varint(n)) + kv)
    return out


# --- spans -----------------------------------------------------------------------------------------


def _flags(parent: Any) -> int:
    return _HAS_IS_REMOTE | _IS_REMOTE if parent is not None and parent.is_remote else _HAS_IS_REMOTE


def _event(event: Any) -> bytes:
    parts = [b"\x09" + _pack_q(event.timestamp) if event.timestamp else b"", _string(b"\x12", event.name)]
    parts += _attributes(b"\x1a", getattr(event, "_attributes", None) or event.attributes)
    if event.dropped_attributes:
        parts.append(b"\x20" + _varint(event.dropped_attributes))
    return b"".join(parts)


def _link(link: Any) -> bytes:
    ctx = link.context
    parts = [_ld(b"\x0a", ctx.trace_id.to_bytes(16, "big")), _ld(b"\x12", ctx.span_id.to_bytes(8, "big"))]
    parts += _attributes(b"\x22", link.attributes)
    if link.dropped_attributes:
        parts.append(b"\x28" + _varint(link.dropped_attributes))
    parts.append(b"\x35" + _pack_i(_flags(ctx)))
    return b"".join(parts)


def _span(span: ReadableSpan) -> bytes:
    ctx = span.get_span_context()
    parts = [_ld(b"\x0a", ctx.trace_id.to_bytes(16, "big")), _ld(b"\x12", ctx.span_id.to_bytes(8, "big"))]
    if ctx.trace_state:
        parts.append(_string(b"\x1a", ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())))
    parent = span.parent
    if parent is not None:
        parts.append(_ld(b"\x22", parent.span_id.to_bytes(8, "big")))
    parts.append(_string(b"\x2a", span.name))
    parts.append(b"\x30" + _SMALL[span.kind.value + 1])
    if span.start_time:
        parts.append(b"\x39" + _pack_q(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _pack_q(span.end_time))
    parts += _attributes(b"\x4a", getattr(span, "_attributes", None) or span.attributes)
    if span.dropped_attributes:
        parts.append(b"\x50" + _varint(span.dropped_attributes))
    for event in span.events:
        parts.append(_ld(b"\x5a", _event(event)))
    if span.dropped_events:
        parts.append(b"\x60" + _varint(span.dropped_events))
    for link in span.links:
        parts.append(_ld(b"\x6a", _link(link)))
    if span.dropped_links:
        parts.append(b"\x70" + _varint(span.dropped_links))
    status = span.status
    code = status.status_code.value
    parts.append(_ld(b"\x7a", _string(b"\x12", status.description or "") + (b"\x18" + _SMALL[code] if code else b"")))
    parts.append(b"\x85\x01" + _pack_i(_flags(parent)))
    return b"".join(parts)


# --- resource and scope, cached ----------------------------------------------------------------------

# Keyed by id(): Resource.__hash__ serialises every attribute to JSON, on each call. The object is kept
# beside its bytes so a recycled id can never return another object's encoding.
_resource_cache: dict[int, tuple[Any, bytes]] = {}
_scope_cache: dict[int, tuple[Any, bytes]] = {}


def _cached(cache: dict[int, tuple[Any, bytes]], obj: Any, encode: Any) -> bytes:
    entry = cache.get(id(obj))
    if entry is not None and entry[0] is obj:
        return entry[1]
    encoded = encode(obj)
    if len(cache) >= _CACHE_MAX_ENTRIES:
        cache.clear()
    cache[id(obj)] = (obj, encoded)
    return encoded


def _encode_resource(resource: Any) -> bytes:
    return b"".join(_attributes(b"\x0a", resource.attributes))


def _encode_scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    parts = [_string(b"\x0a", scope.name), _string(b"\x12", scope.version or "")]
    return b"".join(parts + _attributes(b"\x1a", scope.attributes))


def encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """``ExportTraceServiceRequest`` wire bytes for ``spans``, grouped by resource, then scope."""
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource = span.resource
        group = groups.get(id(resource))
        if group is None:
            group = groups[id(resource)] = (resource, {})
        scope = span.instrumentation_scope or None
        scoped = group[1].get(id(scope))
        if scoped is None:
            scoped = group[1][id(scope)] = (scope, [])
        scoped[1].append(_ld(b"\x12", _span(span)))
    out = []
    for resource, by_scope in groups.values():
        parts = [_ld(b"\x0a", _cached(_resource_cache, resource, _encode_resource))]
        for scope, encoded in by_scope.values():
            scope_spans = [_ld(b"\x0a", _cached(_scope_cache, scope, _encode_scope)), *encoded]
            if scope is not None and scope.schema_url:
                scope_spans.append(_string(b"\x1a", scope.schema_url))
            parts.append(_ld(b"\x12", b"".join(scope_spans)))
        if resource.schema_url:
            parts.append(_string(b"\x1a", resource.schema_url))
        out.append(_ld(b"\x0a", b"".join(parts)))
    return b"".join(out)


# --- exporter --------------------------------------------------------------------------------------------


class _BytesTraceStub:
    """``TraceServiceStub`` whose Export takes the request already serialised."""

    def __init__(self, channel: Any) -> None:
        self.Export = channel.unary_unary(
            _EXPORT_METHOD,
            request_serializer=lambda data: data,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )


class FastOTLPSpanExporter(OTLPSpanExporter):
    """``OTLPSpanExporter`` (same arguments and environment variables) encoding with ``encode_request``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stub = _BytesTraceStub
        self._client = _BytesTraceStub(self._channel)

    def _translate_data(self, data: Sequence[ReadableSpan]) -> bytes:  # type: ignore[override]
        return encode_request(data)

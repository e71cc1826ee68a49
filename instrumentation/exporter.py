"""A faster OTLP/gRPC span exporter for the agent process: same wire bytes' meaning, less CPU.

The SDK's exporter builds one protobuf object per span, attribute and value in Python before
serialising (``encode_spans``); for an LLM span with a dozen attributes that costs more than the
instrumentation itself, on the agent's CPU. This module writes the protobuf wire format of
``ExportTraceServiceRequest`` directly:

* ``snapshot(span)`` takes what encoding needs of a finished span (cheap, where the span ends);
  ``encode_snapshot`` turns them into the span's ``ScopeSpans.spans`` field and the ``ResourceSpans`` /
  ``ScopeSpans`` headers it goes under (resource and scope encoded once, cached);
* string (up to 128 characters), int, bool and float attributes (model, provider, operation, URL, token
  counts, rewards: mostly the same on every call) are cached as whole ``KeyValue`` fields, keyed by
  (key, value); longer strings (messages) are copied once into their field;
* ``assemble(items)`` groups encoded spans into a request; ``encode_request(spans)`` does both steps.

Where the C extension ``_encode`` (instrumentation/_encode.c) is built, ``encode_snapshot`` hands it the
snapshots of the common shape (no events or links, plain attribute values): ~0.4 us a chat span against
~4.5 us here. The Python code below is the reference, for everything else (and everything, without the
extension); the C encoder's bytes equal it byte for byte.

``FastOTLPSpanExporter`` is the SDK's ``OTLPSpanExporter`` (same retries, headers, compression, TLS,
endpoint variables) with that encoder and a stub that sends the bytes as they are; ``export_encoded``
sends a request already assembled (``batch.BatchEncodingSpanProcessor``).

Decoded, the request equals ``encode_spans(spans)`` (tests check it field by field).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

try:  # the C encoder (instrumentation/_encode.c): optional, declines what it does not take
    from spanrl.instrumentation import _encode
except ImportError:  # not built here: the Python encoder below encodes every span
    _encode = None

__all__ = ["EncodedRequest", "FastOTLPSpanExporter", "assemble", "encode_request", "encode_snapshot", "snapshot"]

_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_CACHE_MAX_ENTRIES = 4096
_CACHED_VALUE_MAX_CHARS = 128  # longer strings (messages) are encoded each time, never cached
_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_U64 = (1 << 64) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

_pack_q = struct.Struct("<Q").pack
_pack_d = struct.Struct("<d").pack
_pack_i = struct.Struct("<I").pack
_pack_times = struct.Struct("<BQBQ").pack  # start_time_unix_nano (field 7) and end_time (8), fixed64


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    if n < 0x4000:  # lengths of messages and attribute fields: two bytes
        return bytes(((n & 0x7F) | 0x80, n >> 7))
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


def _key_head(key: str) -> bytes:
    head = _key_cache.get(key)
    if head is None:
        head = _string(b"\x0a", key)
        if len(_key_cache) < _CACHE_MAX_ENTRIES:
            _key_cache[key] = head
    return head


def _key_value(key: str, value: Any) -> bytes:
    return _key_head(key) + _ld(b"\x12", _any_value(value))


def _plain(attributes: Any) -> Any:
    """The dict behind the SDK's ``BoundedAttributes`` (iterating that takes a lock per item)."""
    return getattr(attributes, "_dict", attributes)


def _attribute_field(tag: bytes, key: str, value: Any) -> bytes | None:
    """One ``KeyValue`` as field ``tag``; None when the value cannot be encoded (the SDK skips it too)."""
    kind = type(value)
    if kind is str:
        raw = value.encode("utf-8")
        n = len(raw)
        av = b"\x0a" + (_SMALL[n] if n < 0x80 else _varint(n)) + raw
    elif kind is float:
        av = b"\x21" + _pack_d(value)
    elif kind is int and 0 <= value < 0x80:  # token counts, ports, steps: one byte
        av = b"\x18" + _SMALL[value]
    elif kind is tuple or kind is list:  # what the SDK makes of sequences; skips the ABC checks
        try:
            av = _ld(b"\x2a", b"".join([_ld(b"\x0a", _any_value(v)) for v in value]))
        except Exception:
            return None
    else:
        try:
            av = _any_value(value)
        except Exception:  # as the SDK encoder: skip the one attribute, keep the span
            return None
    head = _key_head(key)
    n = len(av)
    kv = head + b"\x12" + (_SMALL[n] if n < 0x80 else _varint(n)) + av
    n = len(kv)
    return tag + (_SMALL[n] if n < 0x80 else _varint(n)) + kv


# tag -> value type -> (key, value) -> the whole field (tag, length, KeyValue). One dict per type, since
# (k, 1) == (k, True) == (k, 1.0) as dict keys. Strings only up to a length: messages are never the
# same twice. Unencodable values are cached as None (skipped, as the SDK encoder does).
_field_caches: dict[bytes, dict[type, dict[tuple[str, Any], bytes | None]]] = {}


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
    """``attributes`` as ``KeyValue`` fields ``tag``."""
    if not attributes:
        return []
    attributes = _plain(attributes)
    return _pairs(tag, attributes.keys(), attributes.values())


def _long_string_field(tag: bytes, key: str, value: str) -> bytes:
    """A string ``KeyValue`` built with one copy of the text (lengths computed, not measured)."""
    raw = value.encode("utf-8")
    n = len(raw)
    head = _key_head(key)
    av_head = b"\x0a" + _varint(n)
    av_len = len(av_head) + n
    kv_head = head + b"\x12" + _varint(av_len)
    return tag + _varint(len(kv_head) + av_len) + kv_head + av_head + raw


def _cached_field(cache: dict[tuple[str, Any], bytes | None], tag: bytes, key: str, value: Any) -> bytes | None:
    field = _attribute_field(tag, key, value)
    if len(cache) >= _CACHE_MAX_ENTRIES:  # unique values (response ids) cycle through it
        cache.clear()
    cache[(key, value)] = field
    return field


def _pairs(tag: bytes, keys: Iterable[str], values: Iterable[Any]) -> list[bytes]:
    caches = _field_caches.get(tag)
    if caches is None:
        caches = _field_caches[tag] = {str: {}, int: {}, bool: {}, float: {}}
    strings, ints, floats = caches[str], caches[int], caches[float]
    out = []
    append = out.append
    for key, value in zip(keys, values):
        kind = type(value)
        if kind is str:
            if len(value) > _CACHED_VALUE_MAX_CHARS:
                append(_long_string_field(tag, key, value))
                continue
            field = strings.get((key, value))
            if field is None:
                field = _cached_field(strings, tag, key, value)
        elif kind is int:
            field = ints.get((key, value))
            if field is None:
                field = _cached_field(ints, tag, key, value)
        elif kind is float and value and value == value:  # not 0.0 == -0.0, not NaN: equal means identical
            field = floats.get((key, value))
            if field is None:
                field = _cached_field(floats, tag, key, value)
        elif kind is float:  # zero and NaN: 0.0 == -0.0 (and NaN matches itself) as a key, not as bits
            field = _attribute_field(tag, key, value)
        else:  # bool, sequences, anything else
            cache = caches.get(kind)
            field = None if cache is None else cache.get((key, value))
            if field is None:
                field = _attribute_field(tag, key, value) if cache is None else _cached_field(cache, tag, key, value)
        if field is not None:
            append(field)
    return out


# --- spans -----------------------------------------------------------------------------------------

_FLAGS_LOCAL, _FLAGS_REMOTE = _HAS_IS_REMOTE, _HAS_IS_REMOTE | _IS_REMOTE
_SPAN_FLAGS = {_FLAGS_LOCAL: b"\x85\x01" + _pack_i(_FLAGS_LOCAL), _FLAGS_REMOTE: b"\x85\x01" + _pack_i(_FLAGS_REMOTE)}
_KIND_FIELDS = {value: b"\x30" + _SMALL[value + 1] for value in range(5)}  # SpanKind.value + 1 on the wire
_STATUS_UNSET = b"\x7a\x00"
_name_cache: dict[str, bytes] = {}


def _flags(parent: Any) -> int:
    return _FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL


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


def _status(code: int, description: str | None) -> bytes:
    body = _string(b"\x12", description or "")
    if code:
        body += b"\x18" + _SMALL[code]
    return _ld(b"\x7a", body)


def snapshot(span: ReadableSpan) -> tuple[Any, ...]:
    """What ``encode_snapshot`` needs of a finished span, read where the span ends (~2 us).

    Only values the garbage collector need not follow once a young collection has seen them (bytes,
    str, numbers) in one flat tuple: the encoded resource and scope, the ids, then the attribute keys
    and values (nested tuples can need more collections to untrack than they survive before
    promotion). A queued ``ReadableSpan``, or anything holding its context, attribute dict or status,
    is promoted to the old generation before it is exported, and each object promoted per LLM call
    adds about 2 us of full collections to it (measured on an agent's heap: ~20 us for a queued span).
    Events and links (rare on these spans) are kept as the SDK's immutable objects.

    It runs once per span between two LLM calls, with the CPU's caches cold: the SDK's own spans are
    read from their slots (no properties), and the last (resource, scope) pair is kept at hand.
    """
    if (type(span) is ReadableSpan and type(span._attributes) is BoundedAttributes
            and type(span._events) is BoundedList and type(span._links) is BoundedList):  # the SDK's classes
        ctx, parent, bounded, events, links = span._context, span._parent, span._attributes, span._events, span._links
        resource, scope, status = span._resource, span._instrumentation_scope, span._status
        name, kind, start, end = span._name, span._kind, span._start_time, span._end_time
        attrs, event_list, link_list = bounded._dict, events._dq, links._dq
        dropped = (bounded.dropped, events.dropped, links.dropped)
        # SpanContext is a tuple: (trace id, span id, remote, flags, trace state, valid)
        trace_id, span_id, state, parent_id = ctx[0], ctx[1], ctx[4], None if parent is None else parent[1]
        remote = parent is not None and parent[2]
    else:
        ctx, parent, attrs, event_list, link_list = (
            span.get_span_context(), span.parent, span.attributes, span.events, span.links
        )
        resource, scope, status = span.resource, span.instrumentation_scope, span.status
        name, kind, start, end = span.name, span.kind, span.start_time, span.end_time
        attrs = getattr(attrs, "_dict", attrs) or {}
        dropped = (span.dropped_attributes, span.dropped_events, span.dropped_links)
        trace_id, span_id, state = ctx.trace_id, ctx.span_id, ctx.trace_state
        parent_id, remote = (None, False) if parent is None else (parent.span_id, parent.is_remote)
    last = _last_group
    group = last[2] if last[0] is resource and last[1] is scope else _group_of(resource, scope)
    # Enum members' ``_value_``: ``.value`` is a property, a Python call per read.
    return (*group, trace_id, span_id, trace_state_text(state), parent_id, remote, name, kind._value_, start, end,
            tuple(event_list) if event_list else None, tuple(link_list) if link_list else None,
            status._status_code._value_, status._description, *dropped, *attrs, *attrs.values())


def trace_state_text(state: Any) -> str | None:
    """A ``TraceState`` as its header text (``k=v,...``); None when empty."""
    if state is DEFAULT_TRACE_STATE or not state:  # the shared empty one first: ``not`` calls __len__
        return None
    return ",".join(f"{k}={v}" for k, v in state.items())


_FIXED = 18  # fields of a snapshot before the attribute keys and values


def encode_snapshot(snap: tuple[Any, ...]) -> tuple[bytes, bytes, bytes]:
    """(resource part, scope part, the span as a ``ScopeSpans.spans`` field) of a ``snapshot``."""
    if _encode is not None:
        field = _encode.encode_snapshot(snap)
        if field is not None:
            return snap[0], snap[1], field
    return _encode_snapshot(snap)


def _encode_snapshot(snap: tuple[Any, ...]) -> tuple[bytes, bytes, bytes]:
    """``encode_snapshot`` in Python: the reference."""
    (resource_part, scope_part, trace_id, span_id, trace_state, parent_id, parent_remote, name, kind, start, end,
     events, links, status_code, status_description, dropped_attributes, dropped_events, dropped_links) = snap[:_FIXED]
    parts = [b"\x0a\x10" + trace_id.to_bytes(16, "big") + b"\x12\x08" + span_id.to_bytes(8, "big")]
    if trace_state:
        parts.append(_string(b"\x1a", trace_state))
    if parent_id is not None:
        parts.append(b"\x22\x08" + parent_id.to_bytes(8, "big"))
    encoded_name = _name_cache.get(name)
    if encoded_name is None:
        encoded_name = _string(b"\x2a", name)
        if len(_name_cache) < _CACHE_MAX_ENTRIES:
            _name_cache[name] = encoded_name
    parts.append(encoded_name)
    parts.append(_KIND_FIELDS[kind])
    if start and end:
        parts.append(_pack_times(0x39, start, 0x41, end))
    else:
        parts.append((b"\x39" + _pack_q(start) if start else b"") + (b"\x41" + _pack_q(end) if end else b""))
    if len(snap) > _FIXED:
        middle = _FIXED + (len(snap) - _FIXED) // 2
        parts += _pairs(b"\x4a", snap[_FIXED:middle], snap[middle:])
    if dropped_attributes:
        parts.append(b"\x50" + _varint(dropped_attributes))
    if events:
        parts += [_ld(b"\x5a", _event(event)) for event in events]
    if dropped_events:
        parts.append(b"\x60" + _varint(dropped_events))
    if links:
        parts += [_ld(b"\x6a", _link(link)) for link in links]
    if dropped_links:
        parts.append(b"\x70" + _varint(dropped_links))
    parts.append(
        _STATUS_UNSET if not status_code and not status_description else _status(status_code, status_description)
    )

    parts.append(_SPAN_FLAGS[_FLAGS_REMOTE if parent_remote else _FLAGS_LOCAL])
    return resource_part, scope_part, _ld(b"\x12", b"".join(parts))


# --- resource and scope, cached ----------------------------------------------------------------------

# Keyed by id(): Resource.__hash__ serialises every attribute to JSON, on each call. The objects are kept
# beside their bytes so a recycled id can never return another object's encoding.
_group_cache: dict[tuple[int, int], tuple[Any, Any, tuple[bytes, bytes]]] = {}


def _encode_resource_part(resource: Any) -> bytes:
    """``ResourceSpans`` fields other than its scope spans: the resource and its schema URL."""
    encoded = _ld(b"\x0a", b"".join(_attributes(b"\x0a", resource.attributes)))
    return encoded + (_string(b"\x1a", resource.schema_url) if resource.schema_url else b"")


def _encode_scope_part(scope: Any) -> bytes:
    """``ScopeSpans`` fields other than its spans: the scope and its schema URL."""
    if scope is None:
        return _ld(b"\x0a", b"")
    parts = [_string(b"\x0a", scope.name), _string(b"\x12", scope.version or "")]
    encoded = _ld(b"\x0a", b"".join(parts + _attributes(b"\x1a", scope.attributes)))
    return encoded + (_string(b"\x1a", scope.schema_url) if scope.schema_url else b"")


def span_group(resource: Any, scope: Any) -> tuple[bytes, bytes]:
    """The encoded (resource, scope) a span is grouped under in a request."""
    key = (id(resource), id(scope))
    entry = _group_cache.get(key)
    if entry is not None and entry[0] is resource and entry[1] is scope:
        return entry[2]
    group = (_encode_resource_part(resource), _encode_scope_part(scope))
    if len(_group_cache) >= _CACHE_MAX_ENTRIES:
        _group_cache.clear()
    _group_cache[key] = (resource, scope, group)
    return group


# The last (resource, scope, group) a span was snapshotted with: one agent's spans mostly share one pair.
_last_group: tuple[Any, Any, tuple[bytes, bytes]] = (None, None, (b"", b""))


def _group_of(resource: Any, scope: Any) -> tuple[bytes, bytes]:
    global _last_group
    group = span_group(resource, scope or None)
    _last_group = (resource, scope, group)  # one tuple swapped whole: safe for the threads that read it
    return group


def assemble(items: Iterable[tuple[bytes, bytes, bytes]]) -> bytes:
    """``ExportTraceServiceRequest`` bytes from (resource part, scope part, encoded span) triples,
    grouped by resource, then scope, in order of first appearance."""
    groups: dict[bytes, dict[bytes, list[bytes]]] = {}
    for resource_part, scope_part, span_field in items:
        scopes = groups.get(resource_part)
        if scopes is None:
            scopes = groups[resource_part] = {}
        encoded = scopes.get(scope_part)
        if encoded is None:
            encoded = scopes[scope_part] = [scope_part]
        encoded.append(span_field)
    # One join at the end: each length prefix is computed from the pieces, none joined twice.
    out: list[bytes] = []
    for resource_part, scopes in groups.items():
        head = len(out)
        out.append(b"")  # the ResourceSpans tag and length, known once its scopes are in
        out.append(resource_part)
        size = len(resource_part)
        for encoded in scopes.values():
            scope_size = sum(map(len, encoded))
            prefix = b"\x12" + _varint(scope_size)
            out.append(prefix)
            out += encoded
            size += len(prefix) + scope_size
        out[head] = b"\x0a" + _varint(size)
    return b"".join(out)


def encode_request(spans: Sequence[ReadableSpan]) -> bytes:
    """``ExportTraceServiceRequest`` wire bytes for ``spans``, grouped by resource, then scope."""
    return assemble([encode_snapshot(snapshot(span)) for span in spans])


# --- exporter --------------------------------------------------------------------------------------------


class EncodedRequest:
    """A request already encoded (``assemble``) and the number of spans in it."""

    __slots__ = ("payload", "spans")

    def __init__(self, payload: bytes, spans: int) -> None:
        self.payload = payload
        self.spans = spans

    def __len__(self) -> int:
        return self.spans


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

    def export_encoded(self, request: EncodedRequest) -> SpanExportResult:
        """Send a request already encoded, with the exporter's retries and deadline."""
        return self._export(request)  # type: ignore[arg-type]

    def _translate_data(self, data: Sequence[ReadableSpan] | EncodedRequest) -> bytes:  # type: ignore[override]
        if isinstance(data, EncodedRequest):
            return data.payload
        return encode_request(data)

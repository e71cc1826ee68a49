"""OTLP trace requests (protobuf, or OTLP/JSON) -> Arrow columns of the spans table.

The walk runs in the receiver's thread (gRPC handler or HTTP worker), never on the writer thread.
Attributes, resource, events and links become JSON text (orjson); the hot keys are also copied into
typed columns. The three token arrays (`spanrl.llm.*`) go only into their INTEGER[] / FLOAT[] columns,
decoded from the compact base64 little-endian encoding with numpy, or from a plain array.

A span that cannot be stored (bad id length, undecodable token ids) is rejected alone: the rest of the
request is kept and the receiver reports the rejected count (OTLP partial success).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import orjson
import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from google.protobuf import json_format

from spanrl.collector.errors import PermanentError
from spanrl import codec
from spanrl import semconv as sc

__all__ = ["SPANS_ARROW_SCHEMA", "EncodedBatch", "decode_json_request", "decode_protobuf_request", "encode_request"]

_TRACE_ID_BYTES = 16
_SPAN_ID_BYTES = 8
_MAX_ERRORS_REPORTED = 5
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MAX = 2**63 - 1  # start_ns / end_ns are BIGINT: a uint64 time past 2262 is rejected per span

_KIND_NAMES = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS_NAMES = ("UNSET", "OK", "ERROR")

_INT_LIST = pa.list_(pa.int32())
_FLOAT_LIST = pa.list_(pa.float32())

SPANS_ARROW_SCHEMA = pa.schema(
    [
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("parent_span_id", pa.string()),
        ("name", pa.string()),
        ("kind", pa.string()),
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("status_code", pa.string()),
        ("status_message", pa.string()),
        ("service_name", pa.string()),
        ("scope_name", pa.string()),
        ("scope_version", pa.string()),
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("attempt", pa.int32()),
        ("mode", pa.string()),
        ("agent_name", pa.string()),
        ("operation_name", pa.string()),
        ("response_id", pa.string()),
        ("policy_version", pa.int32()),
        ("prompt_token_ids", _INT_LIST),
        ("completion_token_ids", _INT_LIST),
        ("logprobs", _FLOAT_LIST),
        ("reward_value", pa.float64()),
        ("reward_name", pa.string()),
        ("attributes", pa.string()),
        ("resource", pa.string()),
        ("events", pa.string()),
        ("links", pa.string()),
    ]
)
"""Arrow schema of one encoded batch: the spans table's columns except ``ingested_ns`` (set at commit)."""

# Token-array attributes: key -> (numpy dtype of the compact encoding, column index in the token lists).
_TOKEN_KEYS = {
    sc.LLM_PROMPT_TOKEN_IDS: 0,
    sc.LLM_COMPLETION_TOKEN_IDS: 1,
    sc.LLM_LOGPROBS: 2,
}


# Hot keys, bound once (module globals are cheaper than attribute lookups in the span loop).
_K_ROLLOUT, _K_TASK, _K_ATTEMPT, _K_MODE = sc.ROLLOUT_ID, sc.TASK_ID, sc.ATTEMPT, sc.MODE
_K_AGENT, _K_OPERATION, _K_RESPONSE_ID = sc.GEN_AI_AGENT_NAME, sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_RESPONSE_ID
_K_POLICY_VERSION = sc.POLICY_VERSION
_K_REWARD_VALUE, _K_REWARD_NAME = sc.REWARD_VALUE, sc.REWARD_NAME
_K_EVAL_SCORE, _K_EVAL_NAME = sc.GEN_AI_EVALUATION_SCORE_VALUE, sc.GEN_AI_EVALUATION_NAME


class _BadSpan(Exception):
    """One span cannot be stored; the message says why."""


@dataclass(slots=True)
class EncodedBatch:
    """The storable spans of one request, as Arrow, plus what was rejected.

    ``table`` is None when no span was accepted. The batch owns its table; consumers may keep it.
    """

    table: pa.Table | None
    accepted: int
    rejected: int = 0
    error_message: str = ""

    @property
    def nbytes(self) -> int:
        """Arrow buffer size, for queue accounting."""
        return 0 if self.table is None else self.table.nbytes


# --- AnyValue -> Python -------------------------------------------------------------------------------
def _array(v: Any) -> list[Any]:
    return [_any(x) for x in v.array_value.values]


def _kvlist(v: Any) -> dict[str, Any]:
    return {kv.key: _any(kv.value) for kv in v.kvlist_value.values}


_GETTERS: dict[str | None, Callable[[Any], Any]] = {
    "string_value": lambda v: v.string_value,
    "int_value": lambda v: v.int_value,
    "double_value": lambda v: v.double_value,
    "bool_value": lambda v: v.bool_value,
    "array_value": _array,
    "kvlist_value": _kvlist,
    "bytes_value": lambda v: base64.b64encode(v.bytes_value).decode("ascii"),
    None: lambda v: None,
}


def _any(v: Any) -> Any:
    return _GETTERS[v.WhichOneof("value")](v)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _GETTERS[kv.value.WhichOneof("value")](kv.value) for kv in kvs}


# --- token arrays ---------------------------------------------------------------------------------------
def _decode_tokens(key: str, v: Any, is_float: bool) -> np.ndarray:
    """An attribute value (base64 string, raw bytes, or array) -> int32 / float32 numpy array."""
    kind = v.WhichOneof("value")
    if kind == "string_value" or kind == "bytes_value":
        dtype = codec.FLOAT32 if is_float else codec.INT32
        try:
            if kind == "string_value":
                return codec.from_base64(v.string_value, dtype)
            return codec.from_bytes(v.bytes_value, dtype)
        except codec.CodecError as exc:
            raise _BadSpan(f"{key} {exc}") from None
    if kind == "array_value":
        values = v.array_value.values
        # Fast path: read every element as the expected kind (a wrong kind reads as 0), then check
        # only the zero entries' real kind.
        if is_float:
            arr = np.asarray([x.double_value for x in values], dtype=np.float64)
        else:
            arr = np.asarray([x.int_value for x in values], dtype=np.int64)
        for i in np.flatnonzero(arr == 0).tolist():
            k = values[i].WhichOneof("value")
            if k == "int_value":
                arr[i] = values[i].int_value
            elif not (is_float and k == "double_value"):
                want = "numbers" if is_float else "integers"
                raise _BadSpan(f"{key}[{i}] is {k or 'empty'}, expected an array of {want}")
        if is_float:
            return arr.astype(np.float32)
        if arr.size and (arr.min() < _INT32_MIN or arr.max() > _INT32_MAX):
            raise _BadSpan(f"{key} has a value outside the int32 range")
        return arr.astype(np.int32)
    raise _BadSpan(f"{key} is {kind or 'empty'}; expected an array or a base64 string")


def _list_column(items: list[np.ndarray | None], np_dtype: str, pa_type: pa.DataType) -> pa.Array:
    n = len(items)
    if all(a is None for a in items):
        return pa.nulls(n, pa_type)
    lengths = np.fromiter((0 if a is None else a.size for a in items), dtype=np.int32, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [a for a in items if a is not None]
    values = np.concatenate(present).astype(np_dtype, copy=False)
    mask = np.fromiter((a is None for a in items), dtype=bool, count=n)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), mask=pa.array(mask))


# --- typed-column coercions (a wrong type leaves the column NULL; the JSON keeps the value) ------------
def _as_str(x: Any) -> str | None:
    if x is None or isinstance(x, str):
        return x
    if isinstance(x, (dict, list)):
        return None
    return str(x)


def _as_int(x: Any) -> int | None:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, int):
        return x if _INT32_MIN <= x <= _INT32_MAX else None
    try:
        value = int(x) if isinstance(x, str) else None
    except ValueError:
        return None
    return value if value is not None and _INT32_MIN <= value <= _INT32_MAX else None


def _as_float(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return None


def _dumps(x: Any) -> str:
    return orjson.dumps(x).decode("utf-8")


# --- the walk -------------------------------------------------------------------------------------------
def encode_request(request: ExportTraceServiceRequest, *, pre_rejected: int = 0, pre_errors: list[str] | None = None) -> EncodedBatch:
    """Walk one request into Arrow columns. ``pre_rejected``/``pre_errors`` carry spans the JSON decoder
    already dropped, so the reply counts them."""
    trace_ids: list[str] = []
    span_ids: list[str] = []
    parent_ids: list[str | None] = []
    names: list[str] = []
    kinds: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    status_codes: list[str] = []
    status_messages: list[str | None] = []
    services: list[str | None] = []
    scope_names: list[str | None] = []
    scope_versions: list[str | None] = []
    rollout_ids: list[str | None] = []
    task_ids: list[str | None] = []
    attempts: list[int | None] = []
    modes: list[str | None] = []
    agents: list[str | None] = []
    operations: list[str | None] = []
    response_ids: list[str | None] = []
    policy_versions: list[int | None] = []
    tokens: tuple[list[np.ndarray | None], ...] = ([], [], [])
    reward_values: list[float | None] = []
    reward_names: list[str | None] = []
    attributes: list[str] = []
    resources: list[str] = []
    events: list[str | None] = []
    links: list[str | None] = []

    errors = list(pre_errors or [])
    rejected = pre_rejected
    span_index = -1
    n_kinds, n_status = len(_KIND_NAMES), len(_STATUS_NAMES)

    for rs in request.resource_spans:
        res = _attrs(rs.resource.attributes)
        res_json = _dumps(res)
        r_service = _as_str(res.get(sc.SERVICE_NAME))
        r_rollout = _as_str(res.get(sc.ROLLOUT_ID))
        r_task = _as_str(res.get(sc.TASK_ID))
        r_attempt = _as_int(res.get(sc.ATTEMPT))
        r_mode = _as_str(res.get(sc.MODE))
        for ss in rs.scope_spans:
            scope = ss.scope
            s_name = scope.name or None
            s_version = scope.version or None
            for span in ss.spans:
                span_index += 1
                try:
                    tid = span.trace_id
                    sid = span.span_id
                    pid = span.parent_span_id
                    if len(tid) != _TRACE_ID_BYTES or not any(tid):
                        raise _BadSpan(f"trace_id must be {_TRACE_ID_BYTES} bytes, not all zero; got {len(tid)} bytes")
                    if len(sid) != _SPAN_ID_BYTES or not any(sid):
                        raise _BadSpan(f"span_id must be {_SPAN_ID_BYTES} bytes, not all zero; got {len(sid)} bytes")
                    if pid and len(pid) != _SPAN_ID_BYTES:
                        raise _BadSpan(f"parent_span_id must be empty or {_SPAN_ID_BYTES} bytes; got {len(pid)} bytes")
                    if span.start_time_unix_nano > _INT64_MAX or span.end_time_unix_nano > _INT64_MAX:
                        raise _BadSpan(f"start/end_time_unix_nano must be below 2^63 (year 2262); got {span.start_time_unix_nano} / {span.end_time_unix_nano}")
                    attrs: dict[str, Any] = {}
                    toks: list[np.ndarray | None] = [None, None, None]
                    for kv in span.attributes:
                        key = kv.key
                        slot = _TOKEN_KEYS.get(key)
                        if slot is None:
                            v = kv.value
                            k = v.WhichOneof("value")
                            if k == "string_value":
                                attrs[key] = v.string_value
                            elif k == "int_value":
                                attrs[key] = v.int_value
                            else:
                                attrs[key] = _GETTERS[k](v)
                        else:
                            toks[slot] = _decode_tokens(key, kv.value, slot == 2)
                    ev_json = None
                    if span.events:
                        ev_json = _dumps(
                            [{"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attrs(e.attributes)} for e in span.events]
                        )
                    ln_json = None
                    if span.links:
                        ln_json = _dumps(
                            [
                                {"trace_id": ln.trace_id.hex(), "span_id": ln.span_id.hex(), "attributes": _attrs(ln.attributes)}
                                for ln in span.links
                            ]
                        )
                except _BadSpan as exc:
                    rejected += 1
                    if len(errors) < _MAX_ERRORS_REPORTED:
                        errors.append(f"span {span_index} ({span.name!r}): {exc}")
                    continue

                trace_ids.append(tid.hex())
                span_ids.append(sid.hex())
                parent_ids.append(pid.hex() if pid else None)
                names.append(span.name)
                k = span.kind
                kinds.append(_KIND_NAMES[k] if 0 <= k < n_kinds else "UNSPECIFIED")
                starts.append(span.start_time_unix_nano)
                ends.append(span.end_time_unix_nano)
                status = span.status
                c = status.code
                status_codes.append(_STATUS_NAMES[c] if 0 <= c < n_status else "UNSET")
                status_messages.append(status.message or None)
                services.append(r_service)
                scope_names.append(s_name)
                scope_versions.append(s_version)
                get = attrs.get
                x = get(_K_ROLLOUT, r_rollout)
                rollout_ids.append(x if x is None or x.__class__ is str else _as_str(x))
                x = get(_K_TASK, r_task)
                task_ids.append(x if x is None or x.__class__ is str else _as_str(x))
                x = get(_K_ATTEMPT, r_attempt)
                attempts.append(None if x is None else _as_int(x))
                x = get(_K_MODE, r_mode)
                modes.append(x if x is None or x.__class__ is str else _as_str(x))
                x = get(_K_AGENT)
                agents.append(x if x is None or x.__class__ is str else _as_str(x))
                x = get(_K_OPERATION)
                operations.append(x if x is None or x.__class__ is str else _as_str(x))
                x = get(_K_RESPONSE_ID)
                response_ids.append(x if x is None or x.__class__ is str else _as_str(x))
                x = get(_K_POLICY_VERSION)
                policy_versions.append(None if x is None else _as_int(x))
                tokens[0].append(toks[0])
                tokens[1].append(toks[1])
                tokens[2].append(toks[2])
                if _K_REWARD_VALUE in attrs:
                    reward_values.append(_as_float(attrs[_K_REWARD_VALUE]))
                    reward_names.append(_as_str(get(_K_REWARD_NAME)))
                elif _K_EVAL_SCORE in attrs:
                    reward_values.append(_as_float(attrs[_K_EVAL_SCORE]))
                    reward_names.append(_as_str(get(_K_EVAL_NAME)))
                else:
                    reward_values.append(None)
                    reward_names.append(None)
                attributes.append(_dumps(attrs))
                resources.append(res_json)
                events.append(ev_json)
                links.append(ln_json)

    message = ""
    if rejected:
        shown = "; ".join(errors)
        more = rejected - len(errors)
        message = f"{rejected} span(s) rejected: {shown}" + (f" (and {more} more)" if more > 0 else "")
    accepted = len(span_ids)
    if not accepted:
        return EncodedBatch(None, 0, rejected, message)
    string = pa.string()
    columns = [
        pa.array(trace_ids, string),
        pa.array(span_ids, string),
        pa.array(parent_ids, string),
        pa.array(names, string),
        pa.array(kinds, string),
        pa.array(starts, pa.int64()),
        pa.array(ends, pa.int64()),
        pa.array(status_codes, string),
        pa.array(status_messages, string),
        pa.array(services, string),
        pa.array(scope_names, string),
        pa.array(scope_versions, string),
        pa.array(rollout_ids, string),
        pa.array(task_ids, string),
        pa.array(attempts, pa.int32()),
        pa.array(modes, string),
        pa.array(agents, string),
        pa.array(operations, string),
        pa.array(response_ids, string),
        pa.array(policy_versions, pa.int32()),
        _list_column(tokens[0], "int32", _INT_LIST),
        _list_column(tokens[1], "int32", _INT_LIST),
        _list_column(tokens[2], "float32", _FLOAT_LIST),
        pa.array(reward_values, pa.float64()),
        pa.array(reward_names, string),
        pa.array(attributes, string),
        pa.array(resources, string),
        pa.array(events, string),
        pa.array(links, string),
    ]
    return EncodedBatch(pa.Table.from_arrays(columns, schema=SPANS_ARROW_SCHEMA), accepted, rejected, message)


# --- decoding request bodies ----------------------------------------------------------------------------
def decode_protobuf_request(body: bytes) -> ExportTraceServiceRequest:
    """Parse an OTLP protobuf body; a malformed one raises `PermanentError` (INVALID_ARGUMENT / 400)."""
    try:
        return ExportTraceServiceRequest.FromString(body)
    except Exception as exc:  # upb raises google.protobuf.message.DecodeError
        raise PermanentError(f"malformed OTLP protobuf ExportTraceServiceRequest ({len(body)} bytes): {exc}") from None


def _hex_to_b64(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _BadSpan(f"{field} must be a hex string, got {type(value).__name__}")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise _BadSpan(f"{field} {value[:40]!r} is not hex") from None
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
                        raise _BadSpan(f"must be an object, got {type(span).__name__}")
                    _fix_span_ids(span)
                    kept.append(span)
                except _BadSpan as exc:
                    rejected += 1
                    if len(errors) < _MAX_ERRORS_REPORTED:
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

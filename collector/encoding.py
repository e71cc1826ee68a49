"""OTLP trace requests (protobuf, or OTLP/JSON) -> Arrow columns of the spans table.

The walk runs in the receiver's thread (gRPC handler or HTTP worker), never on the writer thread.
Attributes, resource, events and links become JSON text (orjson); the hot keys are also copied into
typed columns. The three token arrays (`spanrl.llm.*`) go only into their INTEGER[] / FLOAT[] columns
(`tokens.py`: compact base64, raw bytes, or a plain array decoded from its wire bytes with numpy).
OTLP/JSON bodies are turned into the same protobuf request first (`otlp_json.py`).

A span that cannot be stored (bad id length, undecodable token ids) is rejected alone: the rest of the
request is kept and the receiver reports the rejected count (OTLP partial success). An attribute value
nested deeper than `MAX_NESTING` arrays / kvlists fails the whole request (`PermanentError`), as the
walk's output passing the request's `DecodeBudget` does (counted per span as the rows are made).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import orjson
import pyarrow as pa

from spanrl import semconv as sc
from spanrl.collector.errors import PermanentError
from spanrl.collector.otlp_json import MAX_ERRORS_REPORTED, decode_json_request
from spanrl.collector.tokens import BadSpan, decode_tokens, list_column, resolve_arrays
from spanrl.collector.wire_schema import parse_array, parse_request

__all__ = [
    "MAX_NESTING", "SPANS_ARROW_SCHEMA", "EncodedBatch", "decode_json_request", "decode_protobuf_request",
    "encode_request",

]

MAX_NESTING = 16
"""Arrays and kvlists nested in one attribute value, at most; deeper is INVALID_ARGUMENT / 400 for the
whole request (the C fast path, MAX_DEPTH in wire.h, leaves such a request to this walk)."""

_TRACE_ID_BYTES = 16
_SPAN_ID_BYTES = 8
_ZERO_TRACE_ID, _ZERO_SPAN_ID = bytes(_TRACE_ID_BYTES), bytes(_SPAN_ID_BYTES)
_HEX_PAIRS = np.frombuffer(b"".join(f"{i:02x}".encode() for i in range(256)), np.uint16)  # byte -> its 2 hex chars
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MAX = 2**63 - 1  # start_ns / end_ns are BIGINT: a uint64 time past 2262 is rejected per span

_KIND_NAMES = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS_NAMES = ("UNSET", "OK", "ERROR")
_N_KINDS, _N_STATUS = len(_KIND_NAMES), len(_STATUS_NAMES)

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

# Token-array attributes: key -> index among the three token columns (2, log-probs, is float).
_TOKEN_KEYS = {
    sc.LLM_PROMPT_TOKEN_IDS: 0,
    sc.LLM_COMPLETION_TOKEN_IDS: 1,
    sc.LLM_LOGPROBS: 2,
}


_TOKEN_KEY_NAMES = (sc.LLM_PROMPT_TOKEN_IDS, sc.LLM_COMPLETION_TOKEN_IDS, sc.LLM_LOGPROBS)
_TOKEN_COLUMN = SPANS_ARROW_SCHEMA.get_field_index("prompt_token_ids")  # the three token columns start here
_ROW_FIELDS = [f for f in SPANS_ARROW_SCHEMA if f.name not in ("prompt_token_ids", "completion_token_ids", "logprobs")]
_NO_TOKENS = (None, None, None)  # shared by every span without token arrays

# Hot keys, bound once (module globals are cheaper than attribute lookups in the span loop).
_K_ROLLOUT, _K_TASK, _K_ATTEMPT, _K_MODE = sc.ROLLOUT_ID, sc.TASK_ID, sc.ATTEMPT, sc.MODE
_K_AGENT, _K_OPERATION, _K_RESPONSE_ID = sc.GEN_AI_AGENT_NAME, sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_RESPONSE_ID
_K_POLICY_VERSION = sc.POLICY_VERSION
_K_REWARD_VALUE, _K_REWARD_NAME = sc.REWARD_VALUE, sc.REWARD_NAME
_K_EVAL_SCORE, _K_EVAL_NAME = sc.GEN_AI_EVALUATION_SCORE_VALUE, sc.GEN_AI_EVALUATION_NAME


@dataclass(slots=True)
class EncodedBatch:
    """The storable spans of one request, as Arrow, plus what was rejected.

    ``table`` is None when no span was accepted. The batch owns its table; consumers may keep it.
    """

    table: pa.Table | None
    accepted: int
    rejected: int = 0
    error_message: str = ""
    sender_scopes: frozenset[str] = frozenset()
    """The scopes of the token its sender presented (the receiver sets them; `collector.sender` reads them)."""


# --- AnyValue -> Python -------------------------------------------------------------------------------
# Each getter takes the value and how many arrays / kvlists hold it (0 for an attribute's own value).
def _deeper(depth: int) -> int:
    if depth >= MAX_NESTING:
        raise PermanentError(f"an attribute value nests arrays / kvlists more than {MAX_NESTING} deep (the limit)")
    return depth + 1


def _array(v: Any, depth: int = 0) -> list[Any]:
    depth = _deeper(depth)
    array = v.array_value
    if array.__class__ is bytes:  # as `parse_request` leaves it
        array = parse_array(array)
    return [_GETTERS[x.WhichOneof("value")](x, depth) for x in array.values]


def _kvlist(v: Any, depth: int = 0) -> dict[str, Any]:
    depth = _deeper(depth)
    return {kv.key: _GETTERS[kv.value.WhichOneof("value")](kv.value, depth) for kv in v.kvlist_value.values}


_GETTERS: dict[str | None, Callable[[Any, int], Any]] = {
    "string_value": lambda v, d=0: v.string_value,
    "int_value": lambda v, d=0: v.int_value,
    "double_value": lambda v, d=0: v.double_value,
    "bool_value": lambda v, d=0: v.bool_value,
    "array_value": _array,
    "kvlist_value": _kvlist,
    "bytes_value": lambda v, d=0: base64.b64encode(v.bytes_value).decode("ascii"),
    None: lambda v, d=0: None,
}


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _GETTERS[kv.value.WhichOneof("value")](kv.value) for kv in kvs}


# --- typed-column coercions (a wrong type leaves the column NULL; the JSON keeps the value) ------------
def _as_str(x: Any) -> str | None:
    if x is None or x.__class__ is str:
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


# --- one span -> one row ----------------------------------------------------------------------------------
def _check_ids_and_times(span: Any) -> tuple[bytes, bytes, bytes, int, int]:
    tid, sid, pid = span.trace_id, span.span_id, span.parent_span_id
    if len(tid) != _TRACE_ID_BYTES or tid == _ZERO_TRACE_ID:
        raise BadSpan(f"trace_id must be {_TRACE_ID_BYTES} bytes, not all zero; got {len(tid)} bytes")
    if len(sid) != _SPAN_ID_BYTES or sid == _ZERO_SPAN_ID:
        raise BadSpan(f"span_id must be {_SPAN_ID_BYTES} bytes, not all zero; got {len(sid)} bytes")
    if pid and len(pid) != _SPAN_ID_BYTES:
        raise BadSpan(f"parent_span_id must be empty or {_SPAN_ID_BYTES} bytes; got {len(pid)} bytes")
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start > _INT64_MAX or end > _INT64_MAX:
        raise BadSpan(f"start/end_time_unix_nano must be below 2^63 (year 2262); got {start} / {end}")
    return tid, sid, pid, start, end


def _span_attributes(span: Any) -> tuple[dict[str, Any], Any]:
    """The span's attributes as Python values, and its token arrays apart (they never go into the JSON):
    `_NO_TOKENS`, or a 3-list of arrays / ArrayValues (plain arrays, decoded later for the whole request)."""
    attrs: dict[str, Any] = {}
    toks: Any = _NO_TOKENS
    for kv in span.attributes:
        key = kv.key
        v = kv.value
        if key in _TOKEN_KEYS:
            slot = _TOKEN_KEYS[key]
            if toks is _NO_TOKENS:
                toks = [None, None, None]
            toks[slot] = decode_tokens(key, v, slot == 2)
            continue
        text = v.string_value  # the common kind first: a non-empty string needs no WhichOneof (-13% here)
        if text:
            attrs[key] = text
            continue
        k = v.WhichOneof("value")
        if k == "int_value":
            attrs[key] = v.int_value
        else:
            attrs[key] = _GETTERS[k](v)
    return attrs, toks


def _events_links_json(span: Any) -> tuple[str | None, str | None]:
    ev = ln = None
    if span.events:
        ev = _dumps(
            [{"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attrs(e.attributes)} for e in span.events]
        )
    if span.links:
        ln = _dumps(
            [
                {"trace_id": x.trace_id.hex(), "span_id": x.span_id.hex(), "attributes": _attrs(x.attributes)}
                for x in span.links
            ]
        )
    return ev, ln


def _resource_context(res: dict[str, Any]) -> tuple[str, str | None, str | None, str | None, int | None, str | None]:
    """(resource JSON, service, rollout, task, attempt, mode): the resource's share of every span row."""
    return (
        _dumps(res),
        _as_str(res.get(sc.SERVICE_NAME)),
        _as_str(res.get(sc.ROLLOUT_ID)),
        _as_str(res.get(sc.TASK_ID)),
        _as_int(res.get(sc.ATTEMPT)),
        _as_str(res.get(sc.MODE)),
    )


def _span_row(span: Any, res: tuple, scope_name: str | None, scope_version: str | None) -> tuple[tuple, Any]:
    """One span -> its row in `SPANS_ARROW_SCHEMA` order less the token columns, and its token arrays
    (see `_span_attributes`); BadSpan if it cannot be stored."""
    tid, sid, pid, start, end = _check_ids_and_times(span)
    attrs, toks = _span_attributes(span)
    ev, ln = _events_links_json(span)
    get = attrs.get
    k = span.kind
    status = span.status
    c = status.code
    if _K_REWARD_VALUE in attrs:
        reward = _as_float(attrs[_K_REWARD_VALUE]), _as_str(get(_K_REWARD_NAME))
    elif _K_EVAL_SCORE in attrs:
        reward = _as_float(attrs[_K_EVAL_SCORE]), _as_str(get(_K_EVAL_NAME))
    else:
        reward = None, None
    attempt = get(_K_ATTEMPT, res[4])
    version = get(_K_POLICY_VERSION)
    row = (
        tid,  # raw: hex'd for the whole column at once in `_to_table`
        sid,
        pid,
        span.name,
        _KIND_NAMES[k] if 0 <= k < _N_KINDS else "UNSPECIFIED",
        start,
        end,
        _STATUS_NAMES[c] if 0 <= c < _N_STATUS else "UNSET",
        status.message or None,
        res[1],
        scope_name,
        scope_version,
        _as_str(get(_K_ROLLOUT, res[2])),
        _as_str(get(_K_TASK, res[3])),
        None if attempt is None else _as_int(attempt),
        _as_str(get(_K_MODE, res[5])),
        _as_str(get(_K_AGENT)),
        _as_str(get(_K_OPERATION)),
        _as_str(get(_K_RESPONSE_ID)),
        None if version is None else _as_int(version),
        reward[0],
        reward[1],
        _dumps(attrs),
        res[0],
        ev,
        ln,
    )
    return row, toks


# --- the request -------------------------------------------------------------------------------------------
# What one row costs while the walk runs, counted as it is made: _ROW_BYTES, plus _TEXT_FACTOR x the
# characters of its attributes / events / links JSON (the Python objects they come from, the text, its
# Arrow copy), plus 5/4 x the resource JSON's bytes (repeated in every row's Arrow column). Fitted to peak
# RSS growth: 1.8 kB a span with one attribute, 3.4 kB with 10 string attributes or 10 events, 116 kB
# with a 100,000-character resource (the parse itself is in the body's share, DECODE_FACTOR).
_ROW_BYTES = 2048
_TEXT_FACTOR = 5


class _Meter:
    """The walk's output against a request's `DecodeBudget` (none: unmetered)."""

    __slots__ = ("budget", "produced", "allowed")

    def __init__(self, budget: Any) -> None:
        self.budget = budget
        self.produced = 0
        self.allowed = budget.output_allowance() if budget is not None else float("inf")

    def add(self, nbytes: int) -> None:
        self.produced += nbytes
        if self.produced > self.allowed:
            self.allowed = self.budget.grow_output(self.produced)  # or RetryableError / PayloadTooLargeError


def _row_cost(row: tuple, resource_bytes: int) -> int:
    text = len(row[22]) + (len(row[24]) if row[24] else 0) + (len(row[25]) if row[25] else 0)
    return _ROW_BYTES + _TEXT_FACTOR * text + resource_bytes


def encode_request(
    request: Any, *, pre_rejected: int = 0, pre_errors: list[str] | None = None, budget: Any = None
) -> EncodedBatch:
    """Walk one request (an ExportTraceServiceRequest, or what `decode_protobuf_request` returns) into
    Arrow columns. ``pre_rejected``/``pre_errors`` carry spans the JSON decoder already dropped, so the
    reply counts them. `PermanentError` if an array in it is malformed protobuf or nested past
    MAX_NESTING; with a ``budget`` (`admission.DecodeBudget`), the rows count against it as they are made
    (`DecodeBudget.grow_output`'s errors when it cannot grow)."""
    meter = _Meter(budget)
    rows: list[tuple] = []
    tokens: list[Any] = []
    indexes: list[int] = []  # each row's span index in the request, for late rejections
    errors = [(-1, e) for e in pre_errors or ()]
    rejected = pre_rejected
    index = -1
    for rs in request.resource_spans:
        res = _resource_context(_attrs(rs.resource.attributes))
        resource_bytes = len(res[0].encode()) * 5 // 4
        for ss in rs.scope_spans:
            scope = ss.scope
            s_name, s_version = scope.name or None, scope.version or None
            for span in ss.spans:
                index += 1
                try:
                    row, toks = _span_row(span, res, s_name, s_version)
                except BadSpan as exc:
                    rejected += 1
                    if len(errors) < MAX_ERRORS_REPORTED:  # in index order, so these are the first ones
                        errors.append((index, f"span {index} ({span.name!r}): {exc}"))
                    continue
                meter.add(_row_cost(row, resource_bytes))
                rows.append(row)
                tokens.append(toks)
                indexes.append(index)
    bad = resolve_arrays(tokens, _TOKEN_KEY_NAMES, _NO_TOKENS)
    if bad:
        rejected += len(bad)
        errors.extend((indexes[r], f"span {indexes[r]} ({rows[r][3]!r}): {reason}") for r, reason in bad.items())
        keep = [r for r in range(len(rows)) if r not in bad]
        rows, tokens = [rows[r] for r in keep], [tokens[r] for r in keep]
    message = ""
    if rejected:
        shown = [e for _, e in sorted(errors, key=lambda x: x[0])[:MAX_ERRORS_REPORTED]]
        more = rejected - len(shown)
        message = f"{rejected} span(s) rejected: {'; '.join(shown)}" + (f" (and {more} more)" if more > 0 else "")
    if not rows:
        return EncodedBatch(None, 0, rejected, message)
    return EncodedBatch(_to_table(rows, tokens), len(rows), rejected, message)


def _hex_column(ids: tuple[bytes, ...], width: int) -> pa.Array:
    """Raw ids (each ``width`` bytes, or empty for NULL) -> lowercase hex strings, in one numpy lookup."""
    n = len(ids)
    hexed = _HEX_PAIRS[np.frombuffer(b"".join(ids), np.uint8)]
    if hexed.size == n * width:
        offsets = np.arange(0, (n + 1) * 2 * width, 2 * width, dtype=np.int32)
        return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(hexed))
    present = np.fromiter(map(len, ids), np.int32, n) != 0
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(present * np.int32(2 * width), out=offsets[1:])
    valid = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(hexed), valid, n - int(present.sum()))


def _to_table(rows: list[tuple], tokens: list[Any]) -> pa.Table:
    """Rows -> one Arrow table: one transpose (zip, in C), then one array per column."""
    n = len(rows)
    values = list(zip(*rows))
    columns = [
        _hex_column(values[0], _TRACE_ID_BYTES), _hex_column(values[1], _SPAN_ID_BYTES),
        _hex_column(values[2], _SPAN_ID_BYTES),
    ]
    for column, field in zip(values[3:], _ROW_FIELDS[3:]):
        first = column[0]
        # One value for the whole request (resource, scope, kind, status...): repeated in C, not converted
        # 512 times (~13 us a column). Only None, str and int: their == is exact (unlike 0.0 == -0.0).
        if (first is None or first.__class__ is str or first.__class__ is int) and column.count(first) == n:
            columns.append(pa.nulls(n, field.type) if first is None else pa.repeat(pa.scalar(first, field.type), n))
        else:
            columns.append(pa.array(column, field.type))
    no = _NO_TOKENS
    token_types = ((np.int32, _INT_LIST), (np.int32, _INT_LIST), (np.float32, _FLOAT_LIST))
    for slot, (np_dtype, pa_type) in enumerate(token_types):

        column = list_column([None if t is no else t[slot] for t in tokens], np_dtype, pa_type)
        columns.insert(_TOKEN_COLUMN + slot, column)
    return pa.Table.from_arrays(columns, schema=SPANS_ARROW_SCHEMA)


def decode_protobuf_request(body: bytes) -> Any:
    """Parse an OTLP protobuf body for `encode_request`: an ExportTraceServiceRequest whose arrays are
    their wire bytes (`wire_schema`). A malformed body raises `PermanentError` (INVALID_ARGUMENT / 400),
    here or, for a malformed array inside it, from `encode_request`."""
    return parse_request(body)

"""Token-array attributes (`spanrl.llm.*`) -> int32 / float32 numpy arrays, and Arrow list columns of them.

Three encodings are accepted: spanrl's compact base64 of little-endian values, raw bytes, and a plain
OTLP array (what any SDK sends). The plain array is NOT walked element by element through upb (a
300-id array is 300 AnyValue messages): the collector parses requests with `array_value` kept as its
wire bytes (`wire_schema.py`), and those bytes are decoded with numpy, ~10 arrays per pass. Every
element of an int array is the same small message `0x0A len 0x18 <varint>`, so the whole run is a
sequence of varints whose shape can be checked and decoded vectorised; a float array is fixed-width
`0x0A 0x09 0x21 <8 bytes>`. Anything else (a mixed array, an empty element, an int in a float array)
is parsed with the standard message class (which rejects a malformed one as a malformed request) and
walked per element, which names the bad element. (A request built in Python, e.g. from OTLP/JSON,
has ArrayValue messages instead: they are serialized once, in C, and take the same path.)
`wire_ints` / `wire_doubles` are deliberately few, whole-array numpy calls: at a few hundred values
each call's overhead is as large as its work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from spanrl import codec
from spanrl.collector.wire_schema import parse_strict_array

__all__ = ["BadSpan", "decode_tokens", "list_column", "resolve_arrays", "wire_doubles", "wire_ints"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_ELEMENT_TAG = 0x0A  # ArrayValue.values, field 1, length-delimited
_INT_TAG = 0x18  # AnyValue.int_value, field 3, varint
_DOUBLE_TAG = 0x21  # AnyValue.double_value, field 4, fixed64
_DOUBLE_ELEMENT = 11  # 0x0A 0x09 0x21 + 8 bytes
_MAX_VARINT = 10
_CHUNK_BYTES = 64 * 1024  # wire bytes per numpy pass: ~35 arrays of 300 ids (16 KiB: 1.5x the time, 1 MiB: 1.8x)


class BadSpan(Exception):
    """One span cannot be stored; the message says why."""


def wire_ints(buf: bytes) -> np.ndarray | None:
    """A serialized ArrayValue whose elements are all int_value -> int64 array; None if it is not that shape."""
    found = _wire_ints(buf)
    return None if found is None else found[0]


def _wire_ints(buf: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """`wire_ints`, plus the offset of each element's last byte (to split concatenated arrays).

    Every byte below 0x80 ends a varint; tag, length and int tag are one-byte varints, so each element
    ends every fourth one. Few numpy calls on purpose: at 300 ids each call costs as much as its work.
    """
    b = np.frombuffer(buf, np.uint8)
    if b.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.intp)
    ends = np.flatnonzero(b < 0x80)
    if ends.size == 0 or ends.size & 3 or ends[-1] != b.size - 1:
        return None
    last = ends[3::4]  # the last byte of each element
    head = np.empty_like(last)  # the first byte of each element
    head[0] = 0
    head[1:] = last[:-1] + 1
    width = last - head - 2  # bytes of each value varint
    if not (
        (b[head] == _ELEMENT_TAG).all()
        and (b[head + 2] == _INT_TAG).all()
        and (b[head + 1] == width + 1).all()  # the element's length byte
        and width.max() <= _MAX_VARINT
    ):
        return None
    first = head + 3
    values = (b[first] & 0x7F).astype(np.uint64)
    for j in range(1, int(width.max())):  # token ids take 1-3 bytes, so 0-2 passes
        part = (b[np.minimum(first + j, last)] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
        values |= np.where(width > j, part, np.uint64(0))
    return values.view(np.int64), last  # int_value is int64, two's complement on the wire


def wire_doubles(buf: bytes) -> np.ndarray | None:
    """A serialized ArrayValue whose elements are all double_value -> float64 array; None if not that shape."""
    n, ragged = divmod(len(buf), _DOUBLE_ELEMENT)
    if not n:
        return None if ragged else np.zeros(0, np.float64)
    if (ragged or buf[0::_DOUBLE_ELEMENT] != b"\x0a" * n or buf[1::_DOUBLE_ELEMENT] != b"\x09" * n
            or buf[2::_DOUBLE_ELEMENT] != b"\x21" * n):
        return None
    rows = np.frombuffer(buf, np.uint8).reshape(n, _DOUBLE_ELEMENT)
    return np.ascontiguousarray(rows[:, 3:]).view("<f8").reshape(n)


def _walk_array(key: str, values: Any, is_float: bool) -> np.ndarray:
    """The per-element fallback: read each element as the expected kind, then check the zeros' real kind."""
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
            raise BadSpan(f"{key}[{i}] is {k or 'empty'}, expected an array of {want}")
    return arr


def decode_tokens(key: str, v: Any, is_float: bool) -> Any:
    """An AnyValue -> int32 / float32 array (base64 string, raw bytes), or, for a plain array, its
    ArrayValue, left for `resolve_arrays` to decode with all the request's others. BadSpan if neither."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return v.array_value
    if kind == "string_value" or kind == "bytes_value":
        dtype = codec.FLOAT32 if is_float else codec.INT32
        try:
            if kind == "string_value":
                return codec.from_base64(v.string_value, dtype)
            return codec.from_bytes(v.bytes_value, dtype)
        except codec.CodecError as exc:
            raise BadSpan(f"{key} {exc}") from None
    raise BadSpan(f"{key} is {kind or 'empty'}; expected an array or a base64 string")


def _wire(array: Any) -> bytes:
    """A plain array's wire bytes: as parsed (`wire_schema`), or serialized from an ArrayValue message."""
    return array if array.__class__ is bytes else array.SerializeToString()


def _float32(arr: np.ndarray) -> np.ndarray:
    """Log-probs as float32: a double beyond its range becomes +-inf, as the C fast path's IEEE cast does
    (without numpy's overflow warning)."""
    with np.errstate(over="ignore"):
        return arr.astype(np.float32)


def _one_array(key: str, buf: bytes, is_float: bool) -> np.ndarray:
    """One plain array -> int32 / float32; BadSpan naming the bad element or the range."""
    arr = wire_doubles(buf) if is_float else wire_ints(buf)
    if arr is None:
        arr = _walk_array(key, parse_strict_array(buf).values, is_float)
    if is_float:
        return _float32(arr)
    if arr.size and (arr.min() < _INT32_MIN or arr.max() > _INT32_MAX):
        raise BadSpan(f"{key} has a value outside the int32 range")
    return arr.astype(np.int32)


def resolve_arrays(tokens: list[Any], keys: tuple[str, str, str], no_tokens: Any) -> dict[int, str]:
    """Decode every plain array left in ``tokens`` (one entry per row: ``no_tokens`` or a 3-list) in place.

    Arrays of one column are decoded together, up to `_CHUNK_BYTES` of wire bytes at a time: their
    bytes are concatenated (a concatenation of ArrayValues is one ArrayValue) and split where each
    one ends, so numpy's per-call cost is paid once per chunk, not once per array, while the
    decoder's temporaries (~7x the chunk) stay small next to the request. Returns row -> reason for
    the rows whose arrays cannot be stored; `PermanentError` if an array is malformed protobuf.
    """
    pending: tuple[list[int], list[int], list[int]] = ([], [], [])
    for row, toks in enumerate(tokens):
        if toks is no_tokens:
            continue
        for slot in (0, 1, 2):
            t = toks[slot]
            if t is not None and t.__class__ is not np.ndarray:
                pending[slot].append(row)
    bad: dict[int, str] = {}
    for slot, rows in enumerate(pending):
        chunk: list[tuple[int, bytes]] = []
        size = 0
        for r in rows:
            buf = _wire(tokens[r][slot])
            chunk.append((r, buf))
            size += len(buf)
            if size >= _CHUNK_BYTES:
                _resolve_chunk(tokens, slot, keys[slot], chunk, bad)
                chunk, size = [], 0
        if chunk:
            _resolve_chunk(tokens, slot, keys[slot], chunk, bad)
    return bad


def _split_points(is_float: bool, joined: bytes, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The chunk's values and where each array's start among them; None unless every array has the fast shape."""
    bounds = np.cumsum(lengths)
    if is_float:
        flat = wire_doubles(joined)
        if flat is None or (lengths % _DOUBLE_ELEMENT).any():
            return None
        return flat, bounds[:-1] // _DOUBLE_ELEMENT
    found = _wire_ints(joined)
    if found is None:
        return None
    flat, last = found
    # Each array must end where an element ends: else one array's bytes only look valid joined to the next.
    if not np.isin(bounds[bounds > 0] - 1, last).all():
        return None
    if flat.size and (flat.min() < _INT32_MIN or flat.max() > _INT32_MAX):
        return None
    return flat, np.searchsorted(last, bounds[:-1])


def _resolve_chunk(tokens: list[Any], slot: int, key: str, chunk: list[tuple[int, bytes]], bad: dict[int, str]) -> None:
    is_float = slot == 2
    lengths = np.fromiter((len(buf) for _, buf in chunk), dtype=np.intp, count=len(chunk))
    found = _split_points(is_float, b"".join([buf for _, buf in chunk]), lengths)
    if found is not None:
        flat, starts = found
        flat = _float32(flat) if is_float else flat.astype(np.int32)
        edges = [0, *starts.tolist(), flat.size]
        for i, (r, _) in enumerate(chunk):  # slices, not np.split: its per-part overhead is ~its work here
            tokens[r][slot] = flat[edges[i]:edges[i + 1]]
        return
    for r, buf in chunk:  # something is off (a mixed array, an int past int32): find it, array by array
        try:
            tokens[r][slot] = _one_array(key, buf, is_float)
        except BadSpan as exc:
            bad.setdefault(r, str(exc))


def list_column(
    items: list[np.ndarray | None] | tuple[np.ndarray | None, ...], np_dtype: str, pa_type: pa.DataType
) -> pa.Array:

    """One Arrow list column from per-row arrays (None -> NULL row), with one concatenation."""
    n = len(items)
    if all(a is None for a in items):
        return pa.nulls(n, pa_type)
    lengths = np.fromiter((0 if a is None else a.size for a in items), dtype=np.int32, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate([a for a in items if a is not None]).astype(np_dtype, copy=False)
    mask = np.fromiter((a is None for a in items), dtype=bool, count=n)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), mask=pa.array(mask))

"""OTLP protobuf bodies -> `EncodedBatch`: the compiled fast path when it accepts the body, else Python.

`spanrl.collector._wire` (`_wire.c`, an optional C extension built by `pip install`) reads the request
bytes and returns the spans table's column buffers; Arrow arrays are made over them with
`pa.Array.from_buffers`, with no Python object per span, attribute or token id. It accepts only the
common valid shape (see the C file's header) and returns None for the rest, which `encode_request`
then handles as before, so every rejection and error message stays the Python path's.
`SPANRL_COLLECTOR_DECODER=python` turns the fast path off (benchmarks, tests).
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa

from spanrl import env
from spanrl.collector.encoding import SPANS_ARROW_SCHEMA, EncodedBatch, decode_protobuf_request, encode_request

try:
    from spanrl.collector import _wire  # type: ignore[attr-defined]
except ImportError:  # not built (no compiler at install): the Python decoder does everything
    _wire = None

__all__ = ["active_decoder", "decode_body", "encode_protobuf_body", "fast_available"]

_logger = logging.getLogger(__name__)
_STRING, _LIST, _FIXED = 0, 1, 2
_LAYOUT = [
    (field.type, _LIST if pa.types.is_list(field.type) else _STRING if pa.types.is_string(field.type) else _FIXED)
    for field in SPANS_ARROW_SCHEMA
]


def fast_available() -> bool:
    """Whether the compiled decoder is importable (built at install)."""
    return _wire is not None


def active_decoder() -> str:
    """``"C fast path"`` or ``"python"``: what `encode_protobuf_body` tries first, for the start-up log."""
    if _wire is None:
        return "python (spanrl.collector._wire is not built)"
    if _python_forced():
        return f"python ({env.SPANRL_COLLECTOR_DECODER}=python)"
    return "C fast path (spanrl.collector._wire), python for what it does not accept"


def _python_forced() -> bool:
    return (env.get_str(env.SPANRL_COLLECTOR_DECODER, "auto") or "auto").lower() == "python"


def _use_fast() -> bool:
    return _wire is not None and not _python_forced()


def decode_body(body: bytes) -> EncodedBatch | None:
    """The fast path alone: the request's spans as a batch, or None where it leaves the body to Python."""
    if _wire is None:
        return None
    found = _wire.decode(body)
    if found is None:
        return None
    n, columns = found
    arrays = [_array(n, layout, column) for layout, column in zip(_LAYOUT, columns)]
    return EncodedBatch(pa.Table.from_arrays(arrays, schema=SPANS_ARROW_SCHEMA), n)


def _array(n: int, layout: tuple[pa.DataType, int], column: tuple[Any, Any, bytes, int]) -> pa.Array:
    pa_type, kind = layout
    valid, offsets, values, nulls = column
    bitmap = None if valid is None else pa.py_buffer(valid)
    if kind == _FIXED:
        return pa.Array.from_buffers(pa_type, n, [bitmap, pa.py_buffer(values)], nulls)
    if kind == _STRING:
        return pa.Array.from_buffers(pa_type, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(values)], nulls)
    child = pa.Array.from_buffers(pa_type.value_type, len(values) // 4, [None, pa.py_buffer(values)])
    return pa.Array.from_buffers(pa_type, n, [bitmap, pa.py_buffer(offsets)], nulls, children=[child])


def encode_protobuf_body(body: bytes) -> EncodedBatch | None:
    """An OTLP protobuf body -> its batch (fast path, else `encode_request`); None for a request with
    no resource spans. `PermanentError` if the body is malformed (from the Python path)."""
    if _use_fast():
        batch = decode_body(body)
        if batch is not None:
            return batch
    request = decode_protobuf_request(body)
    if not request.resource_spans:
        return None
    return encode_request(request)

"""OTLP bodies -> `EncodedBatch`: the compiled fast path when it accepts the body, else Python.

`spanrl.collector._wire` (`_wire.c`, an optional C extension built by `pip install`) reads the request
bytes and returns the spans table's column buffers; Arrow arrays are made over them with
`pa.Array.from_buffers`, with no Python object per span, attribute or token id, and no copy. It accepts
only the common valid shape (see the C file's header) and returns None for the rest, which
`encode_request` then handles as before, so every rejection and error message stays the Python path's.
`SPANRL_COLLECTOR_DECODER=python` turns the fast path off (benchmarks, tests): the collector reads it once at
start (`fast_enabled`, the decoder its start-up log names) and its receivers pass that choice per request.

Both decoders count their output against the request's `DecodeBudget` as they produce it, and
`decode_otlp_body` / `encode_protobuf_body` raise only `PermanentError` or `RetryableError`: every other
exception of the decode path is mapped on purpose (`_mapped`), so a receiver never sees one.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import pyarrow as pa

from spanrl import env
from spanrl.collector.admission import DecodeBudget
from spanrl.collector.encoding import (
    MAX_NESTING,
    SPANS_ARROW_SCHEMA,
    EncodedBatch,
    decode_json_request,
    decode_protobuf_request,
    encode_request,
)
from spanrl.collector.errors import PermanentError, RetryableError
from spanrl.errors import CollectorError

try:
    from spanrl.collector import _wire  # type: ignore[attr-defined]

    _IMPORT_ERROR = ""
except ImportError as exc:  # not built (no compiler at install): the Python decoder does everything
    _wire = None
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

__all__ = [
    "active_decoder", "decode_body", "decode_otlp_body", "encode_protobuf_body", "fast_available", "fast_enabled",
    "unavailable_reason",
]

_logger = logging.getLogger(__name__)
_STRING, _LIST, _FIXED = 0, 1, 2
_LAYOUT = [
    (field.type, _LIST if pa.types.is_list(field.type) else _STRING if pa.types.is_string(field.type) else _FIXED)
    for field in SPANS_ARROW_SCHEMA
]


def fast_available() -> bool:
    """Whether the compiled decoder is importable (built at install)."""
    return _wire is not None


def unavailable_reason() -> str:
    """Why the compiled decoder is not importable ("" when it is): the ImportError's text."""
    return _IMPORT_ERROR


def active_decoder() -> str:
    """``"C fast path"`` or ``"python"``: what `encode_protobuf_body` tries first, for the start-up log."""
    if _wire is None:
        return f"python (spanrl.collector._wire is not built: {_IMPORT_ERROR})"
    if _python_forced():
        return f"python ({env.SPANRL_COLLECTOR_DECODER}=python)"
    return "C fast path (spanrl.collector._wire), python for what it does not accept"


def _python_forced() -> bool:
    return (env.get_str(env.SPANRL_COLLECTOR_DECODER, "auto") or "auto").lower() == "python"


def fast_enabled() -> bool:
    """Whether the fast path is built and not turned off (``SPANRL_COLLECTOR_DECODER``, read now)."""
    return _wire is not None and not _python_forced()


def decode_body(body: bytes, budget: DecodeBudget | None = None) -> EncodedBatch | None:
    """The fast path alone: the request's spans as a batch, or None where it leaves the body to Python.
    With a ``budget``, its buffers may take the budget's output allowance, grown as they outgrow it
    (`DecodeBudget.grow_output` raises when it cannot grow)."""
    if _wire is None:
        return None
    limit = -1 if budget is None else budget.output_allowance()
    found = _wire.decode(body, limit)
    while found.__class__ is int:  # its buffers passed `limit` (only with a budget): hold more, decode again
        limit = budget.grow_output(found)  # type: ignore[union-attr]
        found = _wire.decode(body, limit)
    if found is None:
        return None
    n, columns = found
    arrays = [_array(n, layout, column) for layout, column in zip(_LAYOUT, columns)]
    return EncodedBatch(pa.Table.from_arrays(arrays, schema=SPANS_ARROW_SCHEMA), n)


def _array(n: int, layout: tuple[pa.DataType, int], column: tuple[Any, Any, Any, int]) -> pa.Array:
    pa_type, kind = layout
    valid, offsets, values, nulls = column
    bitmap = None if valid is None else pa.py_buffer(valid)
    if kind == _FIXED:
        return pa.Array.from_buffers(pa_type, n, [bitmap, pa.py_buffer(values)], nulls)
    if kind == _STRING:
        return pa.Array.from_buffers(pa_type, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(values)], nulls)
    child = pa.Array.from_buffers(pa_type.value_type, len(values) // 4, [None, pa.py_buffer(values)])
    return pa.Array.from_buffers(pa_type, n, [bitmap, pa.py_buffer(offsets)], nulls, children=[child])


def encode_protobuf_body(
    body: bytes, budget: DecodeBudget | None = None, *, fast: bool | None = None
) -> EncodedBatch | None:
    """An OTLP protobuf body -> its batch (fast path, else `encode_request`); None for a request with
    no resource spans. ``fast``: try the fast path (None: `fast_enabled` now). Raises only
    `PermanentError` (malformed, nested past MAX_NESTING, decoded form larger than the whole budget) or
    `RetryableError` (budget full now, out of memory)."""
    return _mapped(_protobuf, body, budget, fast_enabled() if fast is None else fast)


def decode_otlp_body(
    body: bytes, *, as_json: bool, budget: DecodeBudget | None = None, fast: bool | None = None
) -> EncodedBatch:
    """An OTLP/HTTP body (protobuf, or OTLP/JSON) -> its batch (empty for a request without resource
    spans); raises as `encode_protobuf_body`."""
    if as_json:
        return _mapped(_json, body, budget)
    batch = encode_protobuf_body(body, budget, fast=fast)
    return EncodedBatch(None, 0) if batch is None else batch


def _protobuf(body: bytes, budget: DecodeBudget | None, fast: bool) -> EncodedBatch | None:
    if fast:
        batch = decode_body(body, budget)
        if batch is not None:
            return batch
    request = decode_protobuf_request(body)
    if not request.resource_spans:
        return None
    return encode_request(request, budget=budget)


def _json(body: bytes, budget: DecodeBudget | None) -> EncodedBatch:
    request, rejected, errors = decode_json_request(body)
    return encode_request(request, pre_rejected=rejected, pre_errors=errors, budget=budget)


def _mapped(decode: Callable[..., Any], body: bytes, budget: DecodeBudget | None, *more: Any) -> Any:
    """``decode(body, budget, *more)`` with every exception mapped to permanent or retryable, on purpose:
    the collector's own errors as they are; RecursionError (a nesting the depth check missed) and any
    other error (a decoder bug: the same bytes fail the same way, so retrying cannot help) permanent;
    MemoryError retryable (the machine's state, not the request's)."""
    try:
        return decode(body, budget, *more)
    except CollectorError:
        raise
    except RecursionError:
        raise PermanentError(
            f"attribute values nested too deeply (the limit is {MAX_NESTING} levels of arrays and kvlists)"
        ) from None

    except MemoryError:
        raise RetryableError("the collector ran out of memory decoding this request; retry later") from None
    except Exception as exc:  # noqa: BLE001 - logged with its stack, answered without it
        _logger.exception("decoding a %d-byte OTLP request failed", len(body))
        raise PermanentError(f"the collector cannot decode this request ({type(exc).__name__}: {exc})") from None

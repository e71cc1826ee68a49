"""The differential check of the collector's two protobuf decoders, for the fuzzer and the tests.

`check(body)`: the C fast path (`spanrl.collector._wire`) either declines the body (None: the Python
path decides alone) or gives exactly the Python path's table: every column equal, the JSON text of
attributes / resource / events / links byte for byte, floats bit for bit. Any other outcome (the fast
path storing a body the Python path refuses, or partly rejects, or a different value anywhere) raises
AssertionError. `bench/fuzz/fuzz_wire.c` built with -DFUZZ_DIFF calls it for every input, with the
sanitized decoder linked into the fuzzer in place of the installed extension (`use_wire`);
`tests/collector/test_decoder_differential.py` calls it over a mutated corpus.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from spanrl.collector import fast_decode
from spanrl.collector.encoding import decode_protobuf_request, encode_request
from spanrl.collector.errors import PermanentError

__all__ = ["check", "same_tables", "use_wire"]


def use_wire(module: Any) -> None:
    """Decode with ``module`` (the fuzzer's own sanitized `_wire`) instead of the installed extension."""
    fast_decode._wire = module


def python_path(body: bytes) -> Any:
    """The reference: the Python decoder's batch, or the PermanentError it raises."""
    try:
        return encode_request(decode_protobuf_request(body))
    except PermanentError as exc:
        return exc


def check(body: bytes) -> bool:
    """True if the fast path took ``body`` (and agreed), False if it declined; AssertionError otherwise."""
    fast = fast_decode.decode_body(body)
    if fast is None:
        return False
    ref = python_path(body)
    assert not isinstance(ref, PermanentError), f"the fast path stored a body the Python path refuses: {ref}"
    assert ref.rejected == 0, ("the fast path stored all of a request the Python path partly rejects: "
                               f"{ref.error_message}")
    assert fast.accepted == ref.accepted, (fast.accepted, ref.accepted)
    same_tables(fast.table, ref.table)
    return True


def same_tables(got: pa.Table, want: pa.Table) -> None:
    """Equal schemas and columns; float values compared bit for bit (NaN payloads, -0.0)."""
    assert got.schema.equals(want.schema), (got.schema, want.schema)
    for name in want.column_names:
        g, w = got[name].combine_chunks(), want[name].combine_chunks()
        if pa.types.is_floating(w.type) or (pa.types.is_list(w.type) and pa.types.is_floating(w.type.value_type)):
            assert _float_bits(g) == _float_bits(w), (name, g.to_pylist()[:5], w.to_pylist()[:5])
        else:
            assert g.equals(w), (name, _first_difference(g, w))


def _float_bits(a: pa.Array) -> tuple:
    valid = tuple(a.is_valid().to_pylist())
    if pa.types.is_list(a.type):
        offsets = tuple(a.value_lengths().fill_null(0).to_pylist())
        values = a.flatten()
        return valid, offsets, np.asarray(values.to_numpy(zero_copy_only=False)).view(np.uint32).tobytes()
    values = np.asarray(a.fill_null(0).to_numpy(zero_copy_only=False), np.float64)
    return valid, np.where(np.asarray(valid, bool), values, 0).view(np.uint64).tobytes()


def _first_difference(g: pa.Array, w: pa.Array) -> Any:
    gl, wl = g.to_pylist(), w.to_pylist()
    for i, (x, y) in enumerate(zip(gl, wl)):
        if x != y:
            return i, x, y
    return len(gl), len(wl)

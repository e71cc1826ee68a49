"""Arrow list columns -> padded (B, T) tensors: row lengths, the real-token layout, and the fills.

`pad_transitions` (``spanrl.algorithms.base``) and `check_transitions` read transitions through these.
Writing the tensors is bound by page faults (50k transitions of 300 + 60 tokens: ~180 MB of fresh pages,
mostly the int64 ids, each faulted in and zeroed by the kernel on first touch: ~0.06 s per 120 MB here,
against 0.015 s into memory already touched). So the masks are bool, one byte a token: the real-token
layouts computed for the fills are the attention masks themselves (int64 masks were another 168 MB).
The fills write through torch (`Tensor.copy_` / `fill_`), which splits a big write over its intra-op
threads, so both cores take the page faults: the bench's 50k x 300 prompt ids 0.067 -> 0.038 s (Intel, 2
cores). Filling the tensors on two Python threads at once (NumPy copies) gained nothing on the AMD machine
before (same wall time, more CPU), so the fields are still filled one after another.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

__all__ = ["fill_rows", "flat_values", "list_lengths", "mask_tensor", "new_tensor", "real_positions", "values_within"]


def list_lengths(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Entries per row of a list column (a null list counts as empty), as int64."""
    return np.asarray(pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def flat_values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The values of a list column's rows, concatenated in row order (null rows contribute nothing)."""
    flat = pc.list_flatten(column)
    return flat.to_numpy() if flat.null_count == 0 else flat.to_numpy(zero_copy_only=False)


def values_within(column: pa.ChunkedArray, low: int, high: int) -> bool:
    """Whether every value of the list column's rows lies in ``[low, high)``: one min/max pass per Arrow
    chunk over its values in place (`flat_values` of a column of several chunks copies them all first)."""
    for chunk in column.chunks:
        bounds = pc.min_max(pc.list_flatten(chunk)).as_py()
        if bounds["min"] is not None and (bounds["min"] < low or bounds["max"] >= high):
            return False
    return True


def new_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray]:
    """An uninitialised tensor and its NumPy view (shared memory). Allocated by torch, not NumPy: NumPy
    advises huge pages on big arrays, and the kernel's compaction on first touch cost 0.1-0.4 s per 120 MB
    on a busy machine against 0.08 s for plain pages (measured here)."""
    tensor = torch.empty(shape, dtype=dtype)
    return tensor, tensor.numpy()


def real_positions(lengths: np.ndarray, width: int, *, left: bool) -> np.ndarray | None:
    """(B, width) booleans, True on the real tokens of rows of ``lengths`` padded on the left or right;
    None when every row is full (no padding at all)."""
    if (lengths == width).all():
        return None
    _, real = new_tensor((len(lengths), width), torch.bool)
    positions = np.arange(width)[None, :]
    if left:
        np.greater_equal(positions, (width - lengths)[:, None], out=real)
    else:
        np.less(positions, lengths[:, None], out=real)
    return real


def mask_tensor(real: np.ndarray | None, shape: tuple[int, int]) -> torch.Tensor:
    """The bool (B, T) tensor of ``real`` (True on real tokens), sharing its memory: no copy; ``real``
    None (every row full): all True."""
    return torch.ones(shape, dtype=torch.bool) if real is None else torch.from_numpy(real)


def fill_rows(out: torch.Tensor, real: np.ndarray | None, column: pa.ChunkedArray, fill: float) -> None:
    """Put the rows of list ``column`` into the (B, T) tensor ``out`` where ``real`` is True, ``fill``
    elsewhere (values cast to ``out``'s dtype; int8 0/1 into bool: nonzero is True).

    ``real`` None: every row is full, so each Arrow chunk's values are one reshaped copy into its rows
    (no concatenated copy of the whole column first). Else ``fill`` first (torch: the fresh pages are
    touched on every core), then NumPy's boolean-mask assignment into the touched memory."""
    if real is not None:
        out.fill_(fill)
        out.numpy()[real] = flat_values(column)
        return
    row, width = 0, out.shape[1]
    for chunk in column.chunks:
        n = len(chunk)
        if n:
            out[row:row + n].copy_(_values_tensor(chunk).view(n, width))
            row += n


def _values_tensor(chunk: pa.Array) -> torch.Tensor:
    """A list chunk's values as a 1-D tensor: the Arrow buffer itself (DLPack, read-only, no copy) when
    it has no nulls, else a NumPy copy (nulls as NumPy converts them)."""
    flat = pc.list_flatten(chunk)
    if flat.null_count == 0 and (pa.types.is_integer(flat.type) or pa.types.is_floating(flat.type)):
        return torch.from_dlpack(flat)
    return torch.from_numpy(flat.to_numpy(zero_copy_only=False))

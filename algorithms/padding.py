"""Arrow list columns -> padded (B, T) tensors: row lengths, the real-token layout, and the fills.

`pad_transitions` (``spanrl.algorithms.base``) and `check_transitions` read transitions through these.
Writing the tensors is bound by page faults (50k transitions of 300 + 60 tokens: ~180 MB of fresh pages,
mostly the int64 ids, each faulted in and zeroed by the kernel on first touch: ~0.06 s per 120 MB here,
against 0.015 s into memory already touched). So the masks are bool, one byte a token: the real-token
layouts computed for the fills are the attention masks themselves (int64 masks were another 168 MB).
The fills split the rows into blocks written by a few threads (NumPy releases the GIL while it copies),
so both cores take the page faults; each thread takes the next block when it finishes one, so a thread
starved by another process leaves the rest to the others (torch's `copy_` splits a write evenly over its
intra-op threads: as fast on a quiet machine, slower when another process holds a core, see
docs/architecture.md). The fields are still filled one after another.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial

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


_BLOCK_ROWS = 4096  # rows one thread writes at a time (~10 MB of int64 ids at 300 tokens)
# threads that fill (this one included): the CPUs this process may run on (a pinned rank: 1), at most 4
_THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def fill_rows(out: np.ndarray, real: np.ndarray | None, column: pa.ChunkedArray, fill: float) -> None:
    """Put the rows of list ``column`` into ``out`` where ``real`` is True, ``fill`` elsewhere (values
    cast to ``out``'s dtype; int8 0/1 into bool: nonzero is True), a block of rows per task.

    ``real`` None: every row is full, so each block is one reshaped copy of its rows' values from their
    Arrow chunk (no concatenated copy of the whole column first). Else each block is filled, then its
    real positions take its rows' values (row-major order is the order of the values)."""
    if real is None:
        blocks, row = [], 0
        for chunk in column.chunks:
            for a in range(0, len(chunk), _BLOCK_ROWS):
                rows = chunk.slice(a, _BLOCK_ROWS)
                blocks.append(partial(_copy_full, out[row + a:row + a + len(rows)], rows))
            row += len(chunk)
    else:
        values = flat_values(column)
        starts = np.concatenate(([0], np.cumsum(list_lengths(column))))  # rows [a, b): values [starts[a], starts[b])
        bounds = [(a, min(a + _BLOCK_ROWS, len(out))) for a in range(0, len(out), _BLOCK_ROWS)]
        blocks = [partial(_copy_masked, out[a:b], real[a:b], values[starts[a]:starts[b]], fill) for a, b in bounds]
    _run_blocks(blocks)


def _copy_full(dst: np.ndarray, rows: pa.Array) -> None:
    dst[...] = flat_values(rows).reshape(dst.shape)


def _copy_masked(dst: np.ndarray, real: np.ndarray, values: np.ndarray, fill: float) -> None:
    dst.fill(fill)
    dst[real] = values


def _run_blocks(blocks: list[Callable[[], None]]) -> None:
    """Run ``blocks`` on up to `_THREADS` threads (this one included), each taking the next block when it
    is done with one; the first error is raised here."""
    todo, errors = iter(blocks), []

    def work() -> None:
        try:
            for block in todo:  # a list iterator's next() is atomic under the GIL
                block()
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)

    helpers = [threading.Thread(target=work, daemon=True) for _ in range(min(_THREADS, len(blocks)) - 1)]
    for thread in helpers:
        thread.start()
    work()
    for thread in helpers:
        thread.join()
    if errors:
        raise errors[0]

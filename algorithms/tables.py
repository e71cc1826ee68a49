"""The transition table: its Arrow form (``TRANSITIONS_SCHEMA``), its checks, and its padding into tensors.

Every algorithm reads a batch through :func:`transition_table` (no dataclass per row), checks it with
:func:`check_transitions` (columnar: only the first bad row is read in Python), and pads it into a
:class:`PaddedBatch` with :func:`pad_transitions`. The list-column readers (:func:`list_lengths`,
:func:`flat_values`) serve both.

:class:`PaddedBatch` is TRL's layout (prompts left-padded, completions right-padded); its ``old_logprobs``
are NaN where the server gave none, and :func:`fill_missing_logprobs` computes only those rows.

Writing the tensors is bound by page faults (50k transitions of 300 + 60 tokens: ~180 MB of fresh pages,
mostly the int64 ids, each faulted in and zeroed by the kernel on first touch: ~0.06 s per 120 MB here,
against 0.015 s into memory already touched). So the masks are bool, one byte a token: the real-token
layouts computed for the fills are the attention masks themselves (int64 masks were another 168 MB).
The fills split the rows into blocks written by a few threads (NumPy releases the GIL while it copies),
so both cores take the page faults; each thread takes the next block when it finishes one, so a thread
starved by another process leaves the rest to the others (torch's `copy_` splits a write evenly over its
intra-op threads: as fast on a quiet machine, slower when another process holds a core, see
docs/measurements.md, "third pass"). The fields are still filled one after another.

torch is imported by the functions that make tensors, not by the module: the table and its checks also
serve the collector extra, which has no torch (``spanrl export transitions``, the viewer's credit view).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanrl.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from spanrl.algorithms.transitions import Transition, TransitionBatch

__all__ = [
    "TRANSITIONS_SCHEMA", "PaddedBatch", "check_transitions", "fill_missing_logprobs", "fill_rows", "flat_values",
    "list_lengths", "mask_tensor", "new_tensor", "pad_transitions", "real_positions", "transition_table",
    "transitions_of", "values_within",
]


# --- the table and its list columns ---------------------------------------------------------------
TRANSITIONS_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("attempt", pa.int32()),
        ("agent", pa.string()),
        ("step", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("completion_mask", pa.list_(pa.int8())),
        ("old_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("policy_version", pa.int32()),
        ("retokenized", pa.bool_()),
        ("temperature", pa.float64()),
        ("token_advantages", pa.list_(pa.float32())),
    ]
)
"""Columns of `TransitionBatch.to_arrow` (and of ``spanrl export transitions``)."""


def transitions_of(batch: TransitionBatch | Sequence[Transition]) -> list[Transition]:
    """The transitions of a ``TransitionBatch`` (or of a plain sequence of transitions) as dataclasses."""
    transitions = getattr(batch, "transitions", batch)
    return list(transitions)


def transition_table(batch: TransitionBatch | pa.Table | Sequence[Transition]) -> pa.Table:
    """The transitions as an Arrow table with ``TRANSITIONS_SCHEMA``: the training path's input.

    A ``TransitionBatch`` gives its table without building a dataclass per row, unless its dataclass view
    (``batch.transitions``) was built: a caller may have edited those objects, so they are the truth then.
    A plain sequence of transitions (a sampled mini-batch, a distributed shard) is converted once."""
    if isinstance(batch, pa.Table):
        return batch
    if hasattr(batch, "to_arrow"):
        if "transitions" not in vars(batch):
            return batch.to_arrow()
        batch = batch.transitions
    names = TRANSITIONS_SCHEMA.names
    return pa.Table.from_pylist([{n: getattr(t, n) for n in names} for t in batch], schema=TRANSITIONS_SCHEMA)


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


# --- checks ---------------------------------------------------------------------------------------
def _row_problem(row: dict[str, Any], vocab_size: int | None) -> str | None:
    """What is wrong with one transition row (the first problem), or None."""
    prompt, completion = row["prompt_ids"] or [], row["completion_ids"] or []
    mask, logprobs = row["completion_mask"] or [], row["old_logprobs"] or []
    if not prompt:
        return "prompt_ids is empty"
    if not completion:
        return "completion_ids is empty"
    n = len(completion)
    if len(mask) != n:
        return f"completion_mask has {len(mask)} entries, completion_ids {n}"
    if logprobs and len(logprobs) != n:
        return f"old_logprobs has {len(logprobs)} entries, completion_ids {n}"
    per_token = row.get("token_advantages") or []
    if per_token and len(per_token) != n:
        return f"token_advantages has {len(per_token)} entries, completion_ids {n}"
    if per_token and not np.isfinite(per_token).all():
        return "token_advantages must be finite"
    advantage = row["advantage"]
    if advantage is None or not np.isfinite(advantage):
        return f"advantage must be finite, got {advantage!r}"
    if vocab_size is not None:
        bad = [x for x in (*prompt, *completion) if not 0 <= x < vocab_size]
        if bad:
            return f"token id {bad[0]} is outside the vocabulary (size {vocab_size})"
    return None


def _out_of_vocab_rows(column: pa.ChunkedArray, lengths: np.ndarray, vocab_size: int) -> np.ndarray:
    """Rows with a token id outside ``[0, vocab_size)``."""
    rows = np.zeros(len(lengths), dtype=bool)
    if values_within(column, 0, vocab_size):  # the common case, without a copy of the values
        return rows
    values = flat_values(column)
    if len(values) and (values.min() < 0 or values.max() >= vocab_size):
        bad_at = np.flatnonzero((values < 0) | (values >= vocab_size))
        rows[np.searchsorted(np.cumsum(lengths), bad_at, side="right")] = True
    return rows


def check_transitions(transitions: TransitionBatch | pa.Table | Sequence[Transition], *,
                      vocab_size: int | None = None) -> None:
    """Raise :class:`ConfigError` naming the first malformed transition and field; loses nothing.
    Columnar: the rows are checked with Arrow/NumPy; only the first bad row is read in Python."""
    table = transition_table(transitions)
    if not table.num_rows:
        raise ConfigError("batch has no transitions; an update needs at least one")
    n_p, n_c = list_lengths(table.column("prompt_ids")), list_lengths(table.column("completion_ids"))
    n_m, n_lp = list_lengths(table.column("completion_mask")), list_lengths(table.column("old_logprobs"))
    advantage = np.asarray(table.column("advantage").to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = (n_p == 0) | (n_c == 0) | (n_m != n_c) | ((n_lp != 0) & (n_lp != n_c)) | ~np.isfinite(advantage)
    if "token_advantages" in table.column_names:
        n_ta = list_lengths(table.column("token_advantages"))
        bad |= (n_ta != 0) & (n_ta != n_c)
        nonfinite = np.flatnonzero(~np.isfinite(flat_values(table.column("token_advantages")))) if n_ta.any() else []
        if len(nonfinite):
            bad[np.searchsorted(np.cumsum(n_ta), nonfinite, side="right")] = True
    if vocab_size is not None:
        bad |= _out_of_vocab_rows(table.column("prompt_ids"), n_p, vocab_size)
        bad |= _out_of_vocab_rows(table.column("completion_ids"), n_c, vocab_size)
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    row = table.slice(i, 1).to_pylist()[0]
    problem = _row_problem(row, vocab_size)
    raise ConfigError(f"transition {i} (rollout_id={row['rollout_id']!r}, step={row['step']}): {problem}")


# --- padding into tensors -------------------------------------------------------------------------
@dataclasses.dataclass
class PaddedBatch:
    """Transitions as tensors: prompts left-padded, completions right-padded (TRL's layout)."""

    prompt_ids: torch.Tensor  # (B, P) long
    prompt_mask: torch.Tensor  # (B, P) bool, True = real token
    completion_ids: torch.Tensor  # (B, C) long
    completion_mask: torch.Tensor  # (B, C) bool, True = real token (attention)
    loss_mask: torch.Tensor  # (B, C) bool, True = policy-generated token that the loss counts
    old_logprobs: torch.Tensor | None  # (B, C) float32, sampling log-probs, NaN = unknown; None = none given
    advantages: torch.Tensor  # (B,) float32
    rewards: torch.Tensor  # (B,) float32
    token_advantages: torch.Tensor | None = None  # (B, C) float32 when a row's calls differ (merged); else None

    def loss_advantages(self, width: int) -> torch.Tensor:
        """What the loss multiplies: ``advantages`` (B,), or (B, width) per token when a row has its calls' own."""
        return self.advantages if self.token_advantages is None else self.token_advantages[:, :width]

    def rows_with_advantage(self) -> torch.Tensor:
        """(B,) bool: rows with a nonzero advantage on some token (the others add nothing to the gradient)."""
        return self.advantages != 0 if self.token_advantages is None else (self.token_advantages != 0).any(1)

    def select(self, index: torch.Tensor | slice) -> PaddedBatch:
        """The rows ``index`` of every tensor."""
        return PaddedBatch(
            **{
                f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[index])
                for f in dataclasses.fields(self)
            }
        )


def pad_transitions(transitions: TransitionBatch | pa.Table | Sequence[Transition], *,
                    pad_token_id: int) -> PaddedBatch:
    """Pad transitions into a :class:`PaddedBatch`. ``old_logprobs``: the server's log-probs where a
    transition has them, NaN on the completion tokens of one that has none (retokenized: recompute
    those rows only, :func:`fill_missing_logprobs`); None when no transition has any.

    Columnar: each (B, T) tensor is allocated once and filled from the Arrow list column's flattened
    values through a boolean mask of the padded layout (row-major order is the order of the values; one
    reshaped copy per block of rows of an Arrow chunk when every row is full; blocks of rows on a few
    threads, :func:`fill_rows`), no Python per row. The masks are bool (the attention masks are those
    layouts themselves): where a consumer wants numbers (TRL's inputs, a model's ``attention_mask``) it
    converts its slice."""
    import torch

    table = transition_table(transitions)
    n_p, n_c = list_lengths(table.column("prompt_ids")), list_lengths(table.column("completion_ids"))
    bsz, max_p, max_c = len(n_p), int(n_p.max(initial=0)), int(n_c.max(initial=0))
    p_real = real_positions(n_p, max_p, left=True)  # left-padded prompts; None: every row full
    c_real = real_positions(n_c, max_c, left=False)  # right-padded completions
    prompt_mask, completion_mask = mask_tensor(p_real, (bsz, max_p)), mask_tensor(c_real, (bsz, max_c))
    prompt_ids, p_ids = new_tensor((bsz, max_p), torch.long)
    fill_rows(p_ids, p_real, table.column("prompt_ids"), pad_token_id)
    completion_ids, c_ids = new_tensor((bsz, max_c), torch.long)
    fill_rows(c_ids, c_real, table.column("completion_ids"), pad_token_id)
    loss_mask, loss = new_tensor((bsz, max_c), torch.bool)
    fill_rows(loss, c_real, table.column("completion_mask"), False)  # int8 0/1 -> bool (nonzero: True)
    n_lp = list_lengths(table.column("old_logprobs"))
    known = (n_lp > 0) & (n_lp == n_c)
    old_logprobs = None
    if known.all() and len(known):
        old_logprobs, old = new_tensor((bsz, max_c), torch.float32)
        fill_rows(old, c_real, table.column("old_logprobs"), 0.0)
    elif known.any():
        old_logprobs, old = new_tensor((bsz, max_c), torch.float32)
        real = c_real if c_real is not None else np.ones(old.shape, dtype=bool)
        old.fill(0.0)
        old[real & known[:, None]] = flat_values(table.column("old_logprobs").filter(pa.array(known)))
        old[real & ~known[:, None]] = np.nan
    column = lambda name: np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float32)  # noqa: E731
    token_advantages = _token_advantages(table, c_real, column("advantage"), (bsz, max_c))
    return PaddedBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        advantages=torch.from_numpy(column("advantage")),
        rewards=torch.from_numpy(column("reward")),
        token_advantages=token_advantages,
    )


def _token_advantages(table: pa.Table, c_real: np.ndarray | None, advantage: np.ndarray,
                      shape: tuple[int, int]) -> torch.Tensor | None:
    """(B, C): each completion token's advantage where a row has them (a merged sample of calls with their
    own), the row's advantage elsewhere; None when no row has them (the common case: (B,) suffices)."""
    if "token_advantages" not in table.column_names:
        return None
    n_ta = list_lengths(table.column("token_advantages"))
    known = n_ta > 0
    if not known.any():
        return None
    import torch

    out, arr = new_tensor(shape, torch.float32)
    arr[...] = advantage[:, None]
    real = c_real if c_real is not None else np.ones(shape, dtype=bool)
    arr[real & known[:, None]] = flat_values(table.column("token_advantages").filter(pa.array(known)))
    return out


def fill_missing_logprobs(data: PaddedBatch, logprobs_of: Callable[[PaddedBatch], torch.Tensor]) -> torch.Tensor:
    """``data.old_logprobs`` (B, C) with its unknown rows (a NaN, or every row when None) computed by
    ``logprobs_of`` (the current policy) on those rows only; the server's log-probs are kept."""
    import torch

    known = data.old_logprobs
    if known is None:
        return logprobs_of(data)
    rows = torch.isnan(known).any(dim=1).nonzero().squeeze(1)  # (b,)
    if not len(rows):
        return known
    filled = known.clone()
    filled[rows] = logprobs_of(data.select(rows)).to(filled.dtype)
    return filled


def new_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray]:
    """An uninitialised tensor and its NumPy view (shared memory). Allocated by torch, not NumPy: NumPy
    advises huge pages on big arrays, and the kernel's compaction on first touch cost 0.1-0.4 s per 120 MB
    on a busy machine against 0.08 s for plain pages (measured here)."""
    import torch

    tensor = torch.empty(shape, dtype=dtype)
    return tensor, tensor.numpy()


def real_positions(lengths: np.ndarray, width: int, *, left: bool) -> np.ndarray | None:
    """(B, width) booleans, True on the real tokens of rows of ``lengths`` padded on the left or right;
    None when every row is full (no padding at all)."""
    if (lengths == width).all():
        return None
    import torch

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
    import torch

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

"""Transitions as an Arrow table (``TRANSITIONS_SCHEMA``), the training path's input, and its checks.

Every algorithm reads a batch through :func:`transition_table` (no dataclass per row), checks it with
:func:`check_transitions` (columnar: only the first bad row is read in Python), and pads it into tensors
with :func:`spanrl.algorithms.padding.pad_transitions`. The list-column readers here are shared by both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanrl.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.algorithms.transitions import Transition, TransitionBatch

__all__ = [
    "TRANSITIONS_SCHEMA", "check_transitions", "flat_values", "list_lengths", "transition_table", "transitions_of",
    "values_within",
]


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
    if vocab_size is not None:
        bad |= _out_of_vocab_rows(table.column("prompt_ids"), n_p, vocab_size)
        bad |= _out_of_vocab_rows(table.column("completion_ids"), n_c, vocab_size)
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    row = table.slice(i, 1).to_pylist()[0]
    problem = _row_problem(row, vocab_size)
    raise ConfigError(f"transition {i} (rollout_id={row['rollout_id']!r}, step={row['step']}): {problem}")



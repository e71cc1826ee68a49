"""The decomposer: span trees -> ordered LLM calls, rewards and rollouts, in DuckDB SQL.

Three tables from the ``spans`` table (store/schema.sql), no per-span Python:

- ``calls``: one row per LLM call of each selected rollout: a policy-server span (``kind = 'SERVER'``,
  ``gen_ai.operation.name`` chat/text_completion, exact token ids) paired with the agent's client span:
  the server span's parent when trace context propagated, else the client span of the same rollout and
  ``gen_ai.response.id``. A client span no server span pairs with is an external call (its messages are
  kept for retokenization). Columns: ``step`` (order in the rollout), ``rollout_calls``, ``agent``
  (nearest ``invoke_agent`` ancestor's ``gen_ai.agent.name``), ``policy_version``, ``temperature`` (of the
  server's log-probs), ``rewards_after`` (rewards before the next call, summed by name), arrays, times.
- ``rewards``: one row per reward (``spanrl.reward.value`` / ``gen_ai.evaluation.score.value`` on a
  span, each ``spanrl.reward`` / ``gen_ai.evaluation.result`` event: two events with the same name and
  value are two rewards), with ``step``: the last call that ended before it (``-1``: before every call).
- ``rollouts``: one row per selected rollout: task, attempt, mode, ``status`` and ``ended_by``
  (views.sql's ``rollout_state``: the one definition), times, stored span rows, and data-quality counts:
  ``duplicate_spans`` (extra copies of call and reward spans), ``late_arrivals`` (calls and rewards
  stored after the rollout's end), ``orphan_calls`` (calls whose ancestor chain breaks at a missing
  parent before reaching an agent), ``duplicate_calls`` (client spans of a call already recorded by
  another instrumentor: the inner of two nested LLM client spans is kept, then one per response id).

All three come from ONE statement (rows told apart by ``row_kind``; it also runs through the collector's
SQL endpoint), which reads the rows the kept-rollout cache (store/kept_rollouts.py) holds for finished rollouts that are
still clean. The statement itself, its filters and columns: store/decomposer_sql.py.

Clocks: calls are ordered by the server span's start (one process and clock for every call of a rollout,
while agents may run on several hosts). A call without a server span gets its client start plus the clock
offset, the median ``server.start - client.start`` of the paired calls of its agent service (else of
the rollout, else 0). A reward (agent clock) follows a call when it is at or after the call's client
span end (no client span: server end minus the offset).

Robustness: a span exported twice counts once (first ingested copy, its rewards too); spans arrive in any
order and after their rollout ended; an orphan whose parent never arrived is walked up as far as its
ancestors go; which rollout a span belongs to is views.sql's ``rollout_spans`` rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanrl.errors import StoreError
from spanrl.store import kept_rollouts
from spanrl.store.decomposer_sql import CALL_COLUMNS, REWARD_COLUMNS, ROLLOUT_COLUMNS, Selection, statement
from spanrl.store.decomposer_sql import call_columns as _wanted_columns  # `decompose` has a parameter of that name
from spanrl.store.sources import SqlSource

__all__ = ["CALL_COLUMNS", "Decomposition", "Selection", "decompose"]


@dataclass
class Decomposition:
    """What `decompose` returns: three Arrow tables and the counts of what was odd in the data."""

    calls: pa.Table
    rewards: pa.Table
    rollouts: pa.Table
    report: dict[str, int] = field(default_factory=dict)



def _run(con: duckdb.DuckDBPyConnection | SqlSource, query: str, params: dict[str, Any]) -> pa.Table:
    try:
        if isinstance(con, duckdb.DuckDBPyConnection):
            return con.sql(query, params=params).to_arrow_table()
        if hasattr(con, "cursor"):
            cur = con.cursor()
            try:
                return cur.sql(query, params=params).to_arrow_table()
            finally:
                cur.close()
        return con.sql(query, params)
    except duckdb.Error as exc:
        raise StoreError(f"decomposer query failed: {exc}") from exc



def decompose(
    con: duckdb.DuckDBPyConnection | SqlSource,
    selection: Selection | None = None,
    *,
    call_columns: Sequence[str] | None = None,
    kept: bool = True,
) -> Decomposition:
    """Decompose the selected rollouts of the span store behind ``con`` into calls, rewards, rollouts.

    ``con`` is a DuckDB connection or cursor (the collector's shared one works), or a
    ``spanrl.store.SpanStore`` (each query then takes its own cursor), or anything with
    ``sql(query, params) -> pyarrow.Table``. See the module docstring for the three tables.
    ``call_columns``: only these columns of ``calls`` (in the table's order; ``rollout_id`` and ``step``
    always); None: all; the others are not computed. ``kept``: read the rows store/kept_rollouts.py kept for
    finished rollouts still clean (same rows; False: all live). `ConfigError` names an unknown column.
    """
    sel = selection or Selection()
    sel.validate()
    columns = _wanted_columns(call_columns)
    params: dict[str, Any] = {}
    kept = kept and getattr(con, "has_kept_rows", True)  # a read-only store of an older spanrl has none
    query = kept_rollouts.read_statement(sel, columns, params) if kept else statement(sel, columns, params)
    rows = _run(con, query, params)  # rows of three kinds, told apart by row_kind
    calls = _row_kind_part(rows, "call", columns, ("rollout_id", "step"))
    rewards = _row_kind_part(rows, "reward", REWARD_COLUMNS, ("rollout_id", "time_ns", "step"))
    rollouts = _row_kind_part(rows, "rollout", ROLLOUT_COLUMNS, ("rollout_id",))
    report = {
        "rollouts": rollouts.num_rows,
        "calls": calls.num_rows,
        "rewards": rewards.num_rows,
        "duplicate_spans": _column_sum(rollouts, "duplicate_spans"),
        "orphan_calls": _column_sum(rollouts, "orphan_calls"),
        "duplicate_calls": _column_sum(rollouts, "duplicate_calls"),
        "late_arrivals": _column_sum(rollouts, "late_arrivals"),
        "failed_rollouts": _count_equal(rollouts, "status", "error"),
        "open_rollouts": _count_equal(rollouts, "status", "open"),
    }
    return Decomposition(calls=calls, rewards=rewards, rollouts=rollouts, report=report)


# --- the one result split by row_kind ------------------------------------------------------------------
# The statement has no ORDER BY (sorting the token arrays inside DuckDB cost more than the rest of the rows),
# so each part is sorted here on its light keys.
_MAX_SORTED_RUNS = 256  # above this many ordered runs, one `take` is cheaper than that many slices


def _row_kind_part(rows: pa.Table, kind: str, columns: Sequence[str], order: Sequence[str]) -> pa.Table:
    """The rows of one kind sorted by ``order``: zero-copy slices where they are contiguous and in order
    in runs (DuckDB's threads emit a few ordered runs, e.g. a rotation), else filtered and taken in order
    (a `take` copies the token arrays: ~0.1 s for 50k calls)."""
    mask = np.asarray(pc.equal(rows.column("row_kind"), kind).to_numpy(zero_copy_only=False), dtype=bool)
    idx = np.flatnonzero(mask)
    if len(idx) == 0:
        return rows.slice(0, 0).select(list(columns))
    if idx[-1] - idx[0] + 1 == len(idx):
        part = rows.slice(int(idx[0]), len(idx)).select(list(columns))
    else:
        part = rows.filter(pa.array(mask)).select(list(columns))
    sort = pc.sort_indices(part, sort_keys=[(c, "ascending") for c in order])  # stable, nulls last
    positions = sort.to_numpy()
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1  # where the sorted order jumps in `part`
    if len(breaks) == 0 and (len(positions) == 0 or positions[0] == 0):
        return part
    if len(breaks) < _MAX_SORTED_RUNS:
        starts = np.concatenate(([0], breaks))
        ends = np.concatenate((breaks, [len(positions)]))
        return pa.concat_tables([part.slice(int(positions[a]), int(b - a)) for a, b in zip(starts, ends)])
    return part.take(sort)


def _column_sum(table: pa.Table, column: str) -> int:
    """The sum of an integer column (0 for an empty table or all nulls)."""
    value = pc.sum(table.column(column)).as_py() if table.num_rows else 0
    return int(value or 0)


def _count_equal(table: pa.Table, column: str, value: str) -> int:
    """How many rows have ``column == value``."""
    if not table.num_rows:
        return 0
    return int(pc.sum(pc.equal(table.column(column), value).cast(pa.int64())).as_py() or 0)

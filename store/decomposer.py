"""The decomposer: span trees -> ordered LLM calls, rewards and rollouts, in DuckDB SQL.

Three tables from the ``spans`` table (store/schema.sql), no per-span Python:

- ``calls``: one row per LLM call of each selected rollout: a policy-server span (``kind = 'SERVER'``,
  ``gen_ai.operation.name`` one of ``semconv.LLM_OPERATIONS``, exact token ids) paired with the agent's client
  span: the server span's parent when trace context propagated, else the client span of the same rollout and
  ``gen_ai.response.id``. A client span no server span pairs with is an external call (its messages are
  kept for retokenization: its attributes, else its ``gen_ai.client.inference.operation.details`` event's,
  else what their ``*_ref`` URIs hold, store/messages.py). Columns: ``step`` (order in the rollout),
  ``rollout_calls``, ``agent`` (nearest ``invoke_agent`` ancestor's ``gen_ai.agent.name``), ``policy_version``,
  ``temperature`` (of the server's log-probs), ``rewards_after`` (rewards before the next call, summed by name),
  arrays, times.
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
SQL endpoint). Its text is store/decomposer.sql, filled in here: at import with what Python generates, per
`statement` with the selection's filters and the columns asked for. ``VERSION`` hashes it with views.sql.

Kept rows: `decompose` runs `read_statement` by default, ONE SELECT that takes the rows the kept-rollout
cache (store/kept_rollouts.py, which writes them under ``VERSION``) holds for the selected finished
rollouts that are still clean, and decomposes the others live, the selection applied to kept rows as to
live ones. Same rows as a live decomposition (tests/store).

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

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanrl import semconv as sc
from spanrl.errors import ConfigError, StoreError
from spanrl.store.messages import SOURCES_COLUMN
from spanrl.store.messages import resolve as resolve_messages
from spanrl.store.sources import SqlSource

__all__ = ["CALL_COLUMNS", "LIGHT_CALL_SQL", "REWARD_COLUMNS", "ROLLOUT_COLUMNS", "SQL", "VERSION", "Decomposition",
           "Selection", "call_columns", "call_filter", "decompose", "read_statement", "rollout_filter", "run_query",
           "statement", "with_clean"]

# --- the statement: store/decomposer.sql, with the text Python generates -------------------------------
_MAX_ANCESTOR_DEPTH = 64  # longest parent chain walked; guards against cycles in bad data
_UNROLLED_LEVELS = 6  # parent links followed by plain joins before the walk recurses (see `tree` in decomposer.sql)
_TREE_COLUMNS = (
    "hash(trace_id, span_id) AS k, "
    "CASE WHEN parent_span_id IS NOT NULL THEN hash(trace_id, parent_span_id) END AS pk, "
    f"CASE WHEN operation_name = '{sc.OP_INVOKE_AGENT}' THEN agent_name END AS agent"
)
_WALK_LEVELS = "\n".join(
    f"""walk_{i} AS MATERIALIZED (
    SELECT w.w_key, w.w_trace, t.pk AS next_k, {i} AS depth, t.agent, t.k IS NULL AS broken
    FROM walk_{i - 1} w LEFT JOIN tree t ON t.k = w.next_k
    WHERE w.agent IS NULL AND w.next_k IS NOT NULL
),"""
    for i in range(2, _UNROLLED_LEVELS + 1)
)
_WALK_UNION = " UNION ALL ".join(
    [f"SELECT * FROM walk_{i}" for i in range(1, _UNROLLED_LEVELS + 1)]
    + [f"SELECT * FROM walk_deep WHERE depth > {_UNROLLED_LEVELS}"]
)
# One scan per LLM operation, each filtered on equality: DuckDB filters such a scan on operation_name before
# reading the other columns, where `IN (...)` read every column of every span (-0.02 s CPU per 1M spans).
_LLM_SCANS = "\n    UNION ALL\n    ".join(
    f"""SELECT rid, trace_id, span_id, parent_span_id, kind, start_ns, end_ns, service_name, rollout_id,
           response_id, policy_version, status_code, ingested_ns, prompt_token_ids IS NOT NULL AS has_ids
    FROM rollout_spans(__SINCE__) WHERE operation_name = '{op}'"""
    for op in sc.LLM_OPERATIONS
)


def _sql_file(name: str) -> str:
    return resources.files("spanrl.store").joinpath(name).read_text(encoding="utf-8")


SQL = (_sql_file("decomposer.sql").replace("__LLM_SCANS__", _LLM_SCANS).replace("__TREE_COLUMNS__", _TREE_COLUMNS)
       .replace("__WALK_LEVELS__", _WALK_LEVELS).replace("__DEEPEST_WALK__", f"walk_{_UNROLLED_LEVELS}")
       .replace("__WALK_UNION__", _WALK_UNION).replace("__MAX_ANCESTOR_DEPTH__", str(_MAX_ANCESTOR_DEPTH)))
"""The statement's text; `statement` fills the placeholders left (the selection, the columns, where reads start)."""
_RF, _CF, _OC, _SR = "__ROLLOUT_FILTER__", "__CALL_FILTER__", "__OUT_CALL_COLUMNS__", "__STEP_REWARDS_JOIN__"
VERSION = hashlib.sha256((SQL + _sql_file("views.sql")).encode()).hexdigest()[:16]
"""The decomposer's version key, a hash of its statement and views.sql: rows kept under another are never read."""

# The light call columns (decomposer.sql's out_calls) as SQL. A caller asks for those it reads (`call_columns`): the
# rest cost nothing (`rewards_after` is a grouping and a join: with the span ids ~0.1 s CPU of 0.7 for 50k).
LIGHT_CALL_SQL = {
    "rollout_id": "c.rollout_id", "task_id": "ro.task_id", "attempt": "ro.attempt", "mode": "ro.mode",
    "rollout_status": "ro.status", "agent": "a.agent", "step": "c.step", "rollout_calls": "c.rollout_calls",
    "policy_version": "c.policy_version", "rewards_after": "coalesce(sr.rewards_after, MAP {}::MAP(VARCHAR, DOUBLE))",
    "response_id": "c.response_id", "status_code": "c.status_code", "order_ns": "c.order_ns",
    "agent_end_ns": "c.agent_end_ns", "clock_offset_ns": "c.offset_ns", "server_trace_id": "c.s_trace",
    "server_span_id": "c.s_span", "client_trace_id": "c.c_trace", "client_span_id": "c.c_span",
}
_STEP_REWARDS_JOIN = "LEFT JOIN step_rewards sr ON sr.rollout_id = c.rollout_id AND sr.step = c.step"
CALL_COLUMNS = (
    "rollout_id", "task_id", "attempt", "mode", "rollout_status", "agent", "step", "rollout_calls",
    "policy_version", "rewards_after", "prompt_ids", "completion_ids", "logprobs", "input_messages",
    "output_messages", "response_id", "status_code", "order_ns", "agent_end_ns", "clock_offset_ns",
    "server_trace_id", "server_span_id", "client_trace_id", "client_span_id", "temperature",
)
REWARD_COLUMNS = (
    "rollout_id", "name", "value", "time_ns", "source", "step", "rollout_calls",
    "ingested_ns",  # when the collector stored it: "the latest reward" goes by it (the sender's clock can be anything)
)
ROLLOUT_COLUMNS = (
    "rollout_id", "task_id", "attempt", "mode", "status", "start_ns", "end_ns", "span_count",
    "duplicate_spans", "late_arrivals", "orphan_calls", "duplicate_calls", "ended_by",
)


@dataclass
class Selection:
    """Which rollouts and calls to decompose. Every filter is optional; ``None`` selects all."""

    rollout_ids: Sequence[str] | None = None
    """Only these rollouts."""
    agents: Sequence[str] | None = None
    """Only calls whose agent (nearest ``invoke_agent`` ancestor) is one of these names."""
    mode: str | None = None
    """Only rollouts of this mode (``train`` / ``val``); a rollout that recorded no mode counts as ``train``."""
    since_ns: int | None = None
    """Only rollouts whose first span starts at or after this time (unix ns)."""
    until_ns: int | None = None
    """Only rollouts whose first span starts before this time (unix ns)."""
    min_policy_version: int | None = None
    """Only calls served by this policy version or a newer one (calls without a version are dropped)."""

    def validate(self) -> None:
        """Raise `ConfigError` naming the first bad field."""
        for name in ("rollout_ids", "agents"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{name} must be a sequence of strings, got {value!r}")
        if self.mode is not None and not isinstance(self.mode, str):
            raise ConfigError(f"mode must be a string such as 'train' or 'val', got {self.mode!r}")
        for name in ("since_ns", "until_ns", "min_policy_version"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
        if self.since_ns is not None and self.until_ns is not None and self.until_ns <= self.since_ns:
            raise ConfigError(f"until_ns ({self.until_ns}) must be greater than since_ns ({self.since_ns})")


def rollout_filter(sel: Selection, params: dict[str, Any]) -> str:
    clauses = ["TRUE"]
    if sel.rollout_ids is not None:
        params["rollout_ids"] = list(sel.rollout_ids)
        clauses.append("rollout_id IN (SELECT unnest($rollout_ids))")
    if sel.mode is not None:
        params["mode"] = sel.mode
        clauses.append("coalesce(mode, 'train') = $mode")
    if sel.since_ns is not None:
        params["since_ns"] = sel.since_ns
        clauses.append("start_ns >= $since_ns")
    if sel.until_ns is not None:
        params["until_ns"] = sel.until_ns
        clauses.append("start_ns < $until_ns")
    return " AND ".join(clauses)


def call_filter(
    sel: Selection, params: dict[str, Any], agent: str = "a.agent", version: str = "c.policy_version"
) -> str:
    clauses = ["TRUE"]
    if sel.agents is not None:
        params["agents"] = list(sel.agents)
        clauses.append(f"{agent} IN (SELECT unnest($agents))")
    if sel.min_policy_version is not None:
        params["min_policy_version"] = sel.min_policy_version
        clauses.append(f"{version} >= $min_policy_version")
    return " AND ".join(clauses)


def statement(
    sel: Selection, columns: Sequence[str], params: dict[str, Any], *, rollouts_also: str = "TRUE", since: str = "0"
) -> str:
    """``sel``'s rollouts that pass ``rollouts_also`` (SQL), reading spans ingested at or after ``since`` (SQL)."""
    light = [f"{LIGHT_CALL_SQL[c]} AS {c}" for c in columns if c in LIGHT_CALL_SQL]
    return (SQL.replace("__SINCE__", since).replace(_RF, f"({rollout_filter(sel, params)}) AND ({rollouts_also})")
            .replace(_CF, call_filter(sel, params)).replace(_OC, ", ".join(light))
            .replace(_SR, _STEP_REWARDS_JOIN if "rewards_after" in columns else ""))


def call_columns(wanted: Sequence[str] | None) -> tuple[str, ...]:
    """The calls' columns to return, in the table's order (``rollout_id`` and ``step``: the sort keys)."""
    if wanted is None:
        return CALL_COLUMNS
    if isinstance(wanted, str) or not all(isinstance(c, str) for c in wanted):
        raise ConfigError(f"call_columns must be a sequence of column names, got {wanted!r}")
    unknown = sorted(set(wanted) - set(CALL_COLUMNS))
    if unknown:
        raise ConfigError(f"call_columns: no column {unknown[0]!r}; the calls' columns are {', '.join(CALL_COLUMNS)}")
    keep = {"rollout_id", "step", *wanted}
    return tuple(c for c in CALL_COLUMNS if c in keep)


_wanted_columns = call_columns  # `decompose` has a parameter of that name


# --- kept rows (store/kept_rollouts.py writes them): the statement that reads them plus the rest live -------
# Which kept rollouts are clean. __KEPT_FILTER__: the selection's rollout filter, over the kept rollout rows.
_CLEAN_CTES = f"""kept_sel AS (  -- kept rollouts of this version that the selection takes; every row the last run
    -- left was clean up to its watermark (its 'open' row without rollout), so "fresh" stays short
    SELECT rollout_id, greatest(watermark_ns, (SELECT max(watermark_ns) FROM decomposed
                                               WHERE version = '{VERSION}' AND row_kind = 'open'
                                                 AND rollout_id IS NULL)) AS watermark_ns
    FROM decomposed
    WHERE version = '{VERSION}' AND row_kind = 'rollout' AND __KEPT_FILTER__
),
fresh AS MATERIALIZED (  -- spans stored after the oldest watermark (zone maps skip the older row groups)
    SELECT trace_id, rollout_id, ingested_ns FROM spans
    WHERE ingested_ns > (SELECT min(watermark_ns) FROM kept_sel)
),
touched AS (  -- whose they are (own id, else their trace's: rollout_spans' rule), and whose traces they share
    SELECT rollout_id, ingested_ns FROM fresh WHERE rollout_id IS NOT NULL
    UNION ALL
    SELECT t.rollout_id, f.ingested_ns
    FROM fresh f JOIN trace_rollouts(0, unattributed_only := TRUE) t ON f.rollout_id IS NULL AND t.trace_id = f.trace_id
    UNION ALL
    SELECT s.rollout_id, f.ingested_ns
    FROM fresh f JOIN spans s ON s.trace_id = f.trace_id WHERE s.rollout_id IS NOT NULL
    UNION ALL  -- verdicts from elsewhere: whose they are by views.sql's rule, their keys read over the store
    SELECT rollout_id, ingested_ns
    FROM rollout_rewards((SELECT min(watermark_ns) + 1 FROM kept_sel), usable_only := FALSE, keys_since_ns := 0)
    WHERE is_feedback AND rollout_id IS NOT NULL
),
kept_clean AS (
    SELECT k.rollout_id FROM kept_sel k
    WHERE NOT EXISTS (SELECT 1 FROM touched t WHERE t.rollout_id = k.rollout_id AND t.ingested_ns > k.watermark_ns)
),
live_since AS MATERIALIZED (  -- the oldest span of a rollout read live: of those open at the last run (its
    -- 'open' rows; the one without rollout: spans after it), of the dirty ones; 0 before any run (or after prune)
    SELECT CASE WHEN EXISTS (SELECT 1 FROM decomposed WHERE version = '{VERSION}' AND row_kind = 'open'
                                                       AND rollout_id IS NULL)
           THEN least((SELECT min(first_ingested_ns) FROM decomposed
                       WHERE version = '{VERSION}' AND row_kind = 'open'),
                      (SELECT min(first_ingested_ns) FROM decomposed
                       WHERE version = '{VERSION}' AND row_kind = 'rollout'
                       AND rollout_id IN (SELECT rollout_id FROM kept_sel)
                       AND rollout_id NOT IN (SELECT rollout_id FROM kept_clean)))
           ELSE 0 END AS since
),
"""
_SINCE = "(SELECT since FROM live_since)"
_NOT_KEPT = "rollout_id NOT IN (SELECT rollout_id FROM kept_clean)"


def with_clean(query: str, kept_filter: str) -> str:
    """``query`` (the decomposer's statement) with the CTEs that find the clean kept rollouts first."""
    head = "WITH RECURSIVE\n"
    assert head in query, "the decomposer's statement is a WITH RECURSIVE"
    return query.replace(head, head + _CLEAN_CTES.replace("__KEPT_FILTER__", kept_filter), 1)


def read_statement(sel: Selection, columns: Sequence[str], params: dict[str, Any]) -> str:
    """One SELECT: the kept rows of ``sel``'s clean rollouts, and the rest decomposed live."""
    live = statement(sel, columns, params, rollouts_also=_NOT_KEPT, since=_SINCE)
    other_kinds = set(REWARD_COLUMNS) | set(ROLLOUT_COLUMNS)
    unread = [c for c in CALL_COLUMNS if c in LIGHT_CALL_SQL and c not in columns and c not in other_kinds]
    kept = f"""
UNION ALL BY NAME  -- kept rows of the clean rollouts (store/kept_rollouts.py)
SELECT d.* EXCLUDE (version, watermark_ns, first_ingested_ns{''.join(', ' + c for c in unread)})
FROM decomposed d
WHERE d.version = '{VERSION}' AND d.rollout_id IN (SELECT rollout_id FROM kept_clean)
  AND (d.row_kind <> 'call' OR ({call_filter(sel, params, "d.agent", "d.policy_version")}))
"""
    return with_clean(live, rollout_filter(sel, params)) + kept


# --- running it --------------------------------------------------------------------------------------
@dataclass
class Decomposition:
    """What `decompose` returns: three Arrow tables and the counts of what was odd in the data."""

    calls: pa.Table
    rewards: pa.Table
    rollouts: pa.Table
    report: dict[str, int] = field(default_factory=dict)


def run_query(con: duckdb.DuckDBPyConnection | SqlSource, query: str, params: dict[str, Any], *,
              what: str = "decomposer query") -> pa.Table:
    """``query`` with ``params`` as an Arrow table, on a DuckDB connection, a store (a cursor of its own) or a
    remote SQL source; a DuckDB error is a `StoreError` naming ``what`` failed."""
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
        raise StoreError(f"{what} failed: {exc}") from exc


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
    query = read_statement(sel, columns, params) if kept else statement(sel, columns, params)
    rows = run_query(con, query, params)  # rows of three kinds, told apart by row_kind
    with_messages = "input_messages" in columns or "output_messages" in columns
    calls = _row_kind_part(rows, "call", (*columns, SOURCES_COLUMN) if with_messages else columns,
                           ("rollout_id", "step"))
    no_refs = {"message_refs_read": 0, "message_refs_unread": 0}
    calls, message_counts = resolve_messages(calls) if with_messages else (calls, no_refs)
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
        **message_counts,
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

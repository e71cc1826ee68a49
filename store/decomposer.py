"""The decomposer: span trees -> ordered LLM calls, rewards and rollouts, in DuckDB SQL.

Three queries over the ``spans`` table (store/schema.sql), no per-span Python:

- ``calls``: one row per LLM call of each selected rollout. A call is one policy-server span
  (``kind = 'SERVER'``, ``gen_ai.operation.name`` chat/text_completion, exact token ids), paired with the
  agent's client span of the same call: the server span's parent when trace context propagated, else
  the client span of the same rollout with the same ``gen_ai.response.id``. A client span that no server
  span pairs with is an external call: it keeps its ``gen_ai.input.messages`` / ``output.messages`` for
  retokenization (``spanrl.algorithms.transitions``). Columns: ``step`` (0-based order in the rollout),
  ``rollout_calls``, ``agent`` (nearest ``invoke_agent`` ancestor's ``gen_ai.agent.name``, found by a
  recursive CTE from the client span, else the server span), ``policy_version``, the id arrays, times.
- ``rewards``: one row per reward (``spanrl.reward.value`` / ``gen_ai.evaluation.score.value`` on a
  span, ``spanrl.reward`` / ``gen_ai.evaluation.result`` events), with ``step``: the last call that
  ended before it (``-1``: before every call).
- ``rollouts``: one row per selected rollout: task, attempt, mode, status, times, span counts, and the
  data-quality counts (duplicates, orphans, late spans).

Clocks. The policy server is one process and clock for every call of a rollout, while a multi-agent
rollout may run on several hosts, so calls are ordered by the server span's start. A call without a
server span gets a server-clock time from its client span plus the rollout's clock offset, the median
of ``server.start - client.start`` over the paired calls of the same agent service (else of the
rollout, else 0). Rewards are written by the agent, so they are placed on the agent's clock: a reward
follows a call when its time is at or after the call's client span end (for a call without a client
span: server end minus the offset).

Robustness: a span exported twice counts once (first ingested copy); spans arrive in any order and
after their rollout ended (the store is read as it is now); an orphan whose parent never arrived is
walked up as far as its ancestors go (a call under a missing parent has no agent); a span without
``spanrl.rollout.id`` (e.g. a server span nested under the agent's trace) inherits its trace's rollout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import duckdb
import pyarrow as pa

from spanrl.errors import ConfigError, StoreError
from spanrl.instrumentation import semconv as sc

__all__ = ["Decomposition", "Selection", "decompose"]

_MAX_ANCESTOR_DEPTH = 64  # longest parent chain walked; guards against cycles in bad data
_LLM_OPS_SQL = ", ".join(f"'{op}'" for op in sc.LLM_OPERATIONS)
_EVENT_SCHEMA_JSON = '[{"name": "VARCHAR", "time_ns": "BIGINT", "attributes": "JSON"}]'
_REWARD_EVENTS = (sc.REWARD_SPAN_NAME, sc.GEN_AI_EVALUATION_RESULT_EVENT)
_RF, _CF = "__ROLLOUT_FILTER__", "__CALL_FILTER__"


class _SqlRunner(Protocol):  # a SpanStore, or anything with sql(query, params) -> pa.Table
    def sql(self, query: str, params: Any = None) -> pa.Table: ...


@dataclass
class Selection:
    """Which rollouts and calls to decompose. Every filter is optional; ``None`` selects all."""

    rollout_ids: Sequence[str] | None = None
    """Only these rollouts."""
    agents: Sequence[str] | None = None
    """Only calls whose agent (nearest ``invoke_agent`` ancestor) is one of these names."""
    mode: str | None = None
    """Only rollouts of this mode (``train`` / ``val``)."""
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


@dataclass
class Decomposition:
    """What `decompose` returns: three Arrow tables and the counts of what was odd in the data."""

    calls: pa.Table
    rewards: pa.Table
    rollouts: pa.Table
    report: dict[str, int] = field(default_factory=dict)


# --- SQL ---------------------------------------------------------------------------------------------
# __ROLLOUT_FILTER__ selects rows of `ro` (the rollouts CTE), __CALL_FILTER__ rows of the final calls;
# the rest is fixed text with $parameters.

_ROLLOUTS_CTE = f"""
ro_all AS (
    SELECT rollout_id,
           any_value(task_id) AS task_id,
           max(attempt) AS attempt,
           any_value(mode) AS mode,
           min(start_ns) AS start_ns,
           max(end_ns) AS end_ns,
           bool_or(name = '{sc.ROLLOUT_SPAN_NAME}') AS has_rollout_span,
           bool_or(name = '{sc.ROLLOUT_SPAN_NAME}' AND status_code = 'ERROR') AS rollout_failed,
           min(ingested_ns) FILTER (WHERE name = '{sc.ROLLOUT_SPAN_NAME}') AS rollout_ingested_ns,
           count(*) AS span_rows
    FROM spans
    WHERE rollout_id IS NOT NULL
    GROUP BY rollout_id
),
ro AS (
    SELECT *, CASE WHEN rollout_failed THEN 'error' WHEN has_rollout_span THEN 'finished' ELSE 'open' END AS status
    FROM ro_all
    WHERE __ROLLOUT_FILTER__
)"""

# LLM call spans (deduplicated, rollout inherited from the trace) and their pairing.
_CALLS_CTES = f"""
llm0 AS (
    SELECT trace_id, span_id, parent_span_id, kind, start_ns, end_ns, service_name, rollout_id,
           response_id, policy_version, status_code, attributes,
           prompt_token_ids, completion_token_ids, logprobs
    FROM spans
    WHERE operation_name IN ({_LLM_OPS_SQL})
    QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY ingested_ns) = 1
),
trace_rollout AS (
    SELECT trace_id, min(rollout_id) AS rollout_id
    FROM spans
    WHERE rollout_id IS NOT NULL AND trace_id IN (SELECT trace_id FROM llm0 WHERE rollout_id IS NULL)
    GROUP BY trace_id
),
llm AS (
    SELECT l.* REPLACE (coalesce(l.rollout_id, t.rollout_id) AS rollout_id)
    FROM llm0 l LEFT JOIN trace_rollout t ON t.trace_id = l.trace_id
    WHERE coalesce(l.rollout_id, t.rollout_id) IN (SELECT rollout_id FROM ro)
),
srv AS (SELECT * FROM llm WHERE kind = 'SERVER'),
cli AS (SELECT * FROM llm WHERE kind <> 'SERVER'),
pair AS (  -- each server span with its client span: the parent if it is one, else by response id
    SELECT s.trace_id AS s_trace, s.span_id AS s_span,
           coalesce(cp.trace_id, cr.trace_id) AS c_trace, coalesce(cp.span_id, cr.span_id) AS c_span
    FROM srv s
    LEFT JOIN cli cp ON cp.trace_id = s.trace_id AND cp.span_id = s.parent_span_id
    LEFT JOIN cli cr ON cp.span_id IS NULL AND cr.rollout_id = s.rollout_id AND cr.response_id = s.response_id
    QUALIFY row_number() OVER (PARTITION BY s.trace_id, s.span_id ORDER BY cr.start_ns NULLS LAST) = 1
),
call0 AS (
    SELECT s.rollout_id, s.trace_id AS s_trace, s.span_id AS s_span, c.trace_id AS c_trace, c.span_id AS c_span,
           s.start_ns AS s_start, s.end_ns AS s_end, c.start_ns AS c_start, c.end_ns AS c_end,
           c.service_name AS c_service, coalesce(s.response_id, c.response_id) AS response_id,
           s.policy_version, coalesce(s.status_code, c.status_code) AS status_code,
           s.prompt_token_ids, s.completion_token_ids, s.logprobs,
           coalesce(c.trace_id, s.trace_id) AS w_trace, coalesce(c.span_id, s.span_id) AS w_span,
           CASE WHEN c.span_id IS NOT NULL THEN c.parent_span_id ELSE s.parent_span_id END AS w_parent,
           CASE WHEN s.prompt_token_ids IS NULL THEN c.attributes END AS c_attributes
    FROM srv s
    JOIN pair p ON p.s_trace = s.trace_id AND p.s_span = s.span_id
    LEFT JOIN cli c ON c.trace_id = p.c_trace AND c.span_id = p.c_span
    UNION ALL BY NAME
    SELECT c.rollout_id, c.trace_id AS c_trace, c.span_id AS c_span, c.start_ns AS c_start, c.end_ns AS c_end,
           c.service_name AS c_service, c.response_id, c.status_code,
           c.trace_id AS w_trace, c.span_id AS w_span, c.parent_span_id AS w_parent, c.attributes AS c_attributes
    FROM cli c
    WHERE NOT EXISTS (SELECT 1 FROM pair p WHERE p.c_trace = c.trace_id AND p.c_span = c.span_id)
),
skew_service AS (
    SELECT rollout_id, c_service, median(s_start - c_start)::BIGINT AS offset_ns
    FROM call0 WHERE s_start IS NOT NULL AND c_start IS NOT NULL
    GROUP BY ALL
),
skew_rollout AS (
    SELECT rollout_id, median(s_start - c_start)::BIGINT AS offset_ns
    FROM call0 WHERE s_start IS NOT NULL AND c_start IS NOT NULL
    GROUP BY ALL
),
call1 AS (
    SELECT c.*,
           coalesce(ks.offset_ns, kr.offset_ns, 0) AS offset_ns,
           coalesce(c.s_start, c.c_start + coalesce(ks.offset_ns, kr.offset_ns, 0)) AS order_ns,
           coalesce(c.c_end, c.s_end - coalesce(kr.offset_ns, 0)) AS agent_end_ns
    FROM call0 c
    LEFT JOIN skew_service ks ON ks.rollout_id = c.rollout_id AND ks.c_service IS NOT DISTINCT FROM c.c_service
    LEFT JOIN skew_rollout kr ON kr.rollout_id = c.rollout_id
),
calls AS (
    SELECT *,
           (row_number() OVER (PARTITION BY rollout_id ORDER BY order_ns, coalesce(s_span, c_span)) - 1)::INTEGER AS step,
           (count(*) OVER (PARTITION BY rollout_id))::INTEGER AS rollout_calls
    FROM call1
)"""

_CALLS_SQL = f"""
WITH RECURSIVE {_ROLLOUTS_CTE},
{_CALLS_CTES},
tree AS (
    SELECT DISTINCT trace_id, span_id, parent_span_id,
           CASE WHEN operation_name = '{sc.OP_INVOKE_AGENT}' THEN agent_name END AS agent
    FROM spans
    WHERE trace_id IN (SELECT w_trace FROM calls)
),
walk(w_trace, w_span, trace_id, next_id, depth, agent) AS (
    SELECT w_trace, w_span, w_trace, w_parent, 1, NULL::VARCHAR FROM calls WHERE w_parent IS NOT NULL
    UNION ALL
    SELECT w.w_trace, w.w_span, t.trace_id, t.parent_span_id, w.depth + 1, t.agent
    FROM walk w JOIN tree t ON t.trace_id = w.trace_id AND t.span_id = w.next_id
    WHERE w.agent IS NULL AND w.depth < {_MAX_ANCESTOR_DEPTH}
),
agents AS (
    SELECT w_trace, w_span, arg_min(agent, depth) AS agent
    FROM walk WHERE agent IS NOT NULL GROUP BY ALL
)
SELECT c.rollout_id, ro.task_id, ro.attempt, ro.mode, ro.status AS rollout_status,
       a.agent, c.step, c.rollout_calls, c.policy_version,
       c.prompt_token_ids AS prompt_ids, c.completion_token_ids AS completion_ids, c.logprobs,
       c.c_attributes ->> '$."{sc.GEN_AI_INPUT_MESSAGES}"' AS input_messages,
       c.c_attributes ->> '$."{sc.GEN_AI_OUTPUT_MESSAGES}"' AS output_messages,
       c.response_id, c.status_code, c.order_ns, c.agent_end_ns, c.offset_ns AS clock_offset_ns,
       c.s_trace AS server_trace_id, c.s_span AS server_span_id,
       c.c_trace AS client_trace_id, c.c_span AS client_span_id
FROM calls c
JOIN ro ON ro.rollout_id = c.rollout_id
LEFT JOIN agents a ON a.w_trace = c.w_trace AND a.w_span = c.w_span
WHERE __CALL_FILTER__
ORDER BY c.rollout_id, c.step
"""

_REWARDS_SQL = f"""
WITH {_ROLLOUTS_CTE},
{_CALLS_CTES},
rw0 AS (
    SELECT trace_id, span_id, rollout_id, end_ns AS time_ns,
           coalesce(reward_name, '{sc.DEFAULT_REWARD_NAME}') AS name,
           coalesce(reward_value, 'NaN'::DOUBLE) AS value, 'span' AS source
    FROM spans
    WHERE reward_value IS NOT NULL OR name = '{sc.REWARD_SPAN_NAME}'  -- a reward span without a value: NaN
    UNION ALL
    SELECT trace_id, span_id, rollout_id, ev.time_ns,
           coalesce(ev.attributes ->> '$."{sc.REWARD_NAME}"', ev.attributes ->> '$."{sc.GEN_AI_EVALUATION_NAME}"',
                    '{sc.DEFAULT_REWARD_NAME}') AS name,
           coalesce(TRY_CAST(ev.attributes ->> '$."{sc.REWARD_VALUE}"' AS DOUBLE),
                    TRY_CAST(ev.attributes ->> '$."{sc.GEN_AI_EVALUATION_SCORE_VALUE}"' AS DOUBLE),
                    'NaN'::DOUBLE) AS value,
           'event' AS source
    FROM (
        SELECT trace_id, span_id, rollout_id, unnest(from_json(events, '{_EVENT_SCHEMA_JSON}')) AS ev
        FROM spans
        WHERE events IS NOT NULL
          AND (contains(events, '{_REWARD_EVENTS[0]}') OR contains(events, '{_REWARD_EVENTS[1]}'))
    )
    WHERE ev.name IN ('{_REWARD_EVENTS[0]}', '{_REWARD_EVENTS[1]}')
),
rw_trace AS (
    SELECT trace_id, min(rollout_id) AS rollout_id
    FROM spans
    WHERE rollout_id IS NOT NULL AND trace_id IN (SELECT trace_id FROM rw0 WHERE rollout_id IS NULL)
    GROUP BY trace_id
),
rw AS (  -- one row per reward: a span exported twice, or a value both as attribute and event, counts once
    SELECT r.* REPLACE (coalesce(r.rollout_id, t.rollout_id) AS rollout_id)
    FROM rw0 r LEFT JOIN rw_trace t ON t.trace_id = r.trace_id
    WHERE coalesce(r.rollout_id, t.rollout_id) IN (SELECT rollout_id FROM ro)
    QUALIFY row_number() OVER (PARTITION BY r.trace_id, r.span_id, name, value ORDER BY r.source DESC) = 1
)
SELECT rw.rollout_id, rw.name, rw.value, rw.time_ns, rw.source,
       coalesce(c.step, -1)::INTEGER AS step, coalesce(n.rollout_calls, 0)::INTEGER AS rollout_calls,
       rw.trace_id, rw.span_id
FROM rw ASOF LEFT JOIN calls c ON c.rollout_id = rw.rollout_id AND rw.time_ns >= c.agent_end_ns
LEFT JOIN (SELECT rollout_id, count(*) AS rollout_calls FROM calls GROUP BY rollout_id) n
       ON n.rollout_id = rw.rollout_id
ORDER BY rw.rollout_id, rw.time_ns, rw.span_id
"""

_ROLLOUTS_SQL = f"""
WITH {_ROLLOUTS_CTE},
sel AS (
    SELECT trace_id, span_id, parent_span_id, rollout_id, ingested_ns FROM spans
    WHERE rollout_id IN (SELECT rollout_id FROM ro)
),
ids AS (SELECT DISTINCT trace_id, span_id FROM spans WHERE trace_id IN (SELECT trace_id FROM sel)),
q AS (
    SELECT s.rollout_id,
           count(*) FILTER (WHERE s.parent_span_id IS NOT NULL AND i.span_id IS NULL) AS orphan_spans,
           count(*) - count(DISTINCT (s.trace_id, s.span_id)) AS duplicate_spans,
           count(*) FILTER (WHERE s.ingested_ns > ro.rollout_ingested_ns) AS late_spans
    FROM sel s
    JOIN ro ON ro.rollout_id = s.rollout_id
    LEFT JOIN ids i ON i.trace_id = s.trace_id AND i.span_id = s.parent_span_id
    GROUP BY s.rollout_id
)
SELECT ro.rollout_id, ro.task_id, ro.attempt, ro.mode, ro.status, ro.start_ns, ro.end_ns,
       (ro.span_rows - q.duplicate_spans) AS span_count, q.duplicate_spans, q.orphan_spans, q.late_spans
FROM ro JOIN q USING (rollout_id)
ORDER BY ro.rollout_id
"""


def _rollout_filter(sel: Selection, params: dict[str, Any]) -> str:
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


def _call_filter(sel: Selection, params: dict[str, Any]) -> str:
    clauses = ["TRUE"]
    if sel.agents is not None:
        params["agents"] = list(sel.agents)
        clauses.append("a.agent IN (SELECT unnest($agents))")
    if sel.min_policy_version is not None:
        params["min_policy_version"] = sel.min_policy_version
        clauses.append("c.policy_version >= $min_policy_version")
    return " AND ".join(clauses)


def _run(con: duckdb.DuckDBPyConnection | _SqlRunner, query: str, params: dict[str, Any]) -> pa.Table:
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
    con: duckdb.DuckDBPyConnection | _SqlRunner, selection: Selection | None = None
) -> Decomposition:
    """Decompose the selected rollouts of the span store behind ``con`` into calls, rewards, rollouts.

    ``con`` is a DuckDB connection or cursor (the collector's shared one works), or a
    ``spanrl.store.SpanStore`` (each query then takes its own cursor), or anything with
    ``sql(query, params) -> pyarrow.Table``. See the module docstring for the three tables.
    """
    sel = selection or Selection()
    sel.validate()
    params: dict[str, Any] = {}
    rollout_filter = _rollout_filter(sel, params)
    rollouts = _run(con, _ROLLOUTS_SQL.replace(_RF, rollout_filter), params)
    rewards = _run(con, _REWARDS_SQL.replace(_RF, rollout_filter), params)
    call_params = dict(params)
    calls = _run(
        con,
        _CALLS_SQL.replace(_RF, rollout_filter).replace(_CF, _call_filter(sel, call_params)),
        call_params,
    )
    report = {
        "rollouts": rollouts.num_rows,
        "calls": calls.num_rows,
        "rewards": rewards.num_rows,
        "duplicate_spans": _sum(rollouts, "duplicate_spans"),
        "orphan_spans": _sum(rollouts, "orphan_spans"),
        "late_spans": _sum(rollouts, "late_spans"),
        "failed_rollouts": _count_equal(rollouts, "status", "error"),
        "open_rollouts": _count_equal(rollouts, "status", "open"),
    }
    return Decomposition(calls=calls, rewards=rewards, rollouts=rollouts, report=report)


def _sum(table: pa.Table, column: str) -> int:
    import pyarrow.compute as pc

    value = pc.sum(table.column(column)).as_py() if table.num_rows else 0
    return int(value or 0)


def _count_equal(table: pa.Table, column: str, value: str) -> int:
    import pyarrow.compute as pc

    if not table.num_rows:
        return 0
    return int(pc.sum(pc.equal(table.column(column), value).cast(pa.int64())).as_py() or 0)

"""The rollouts table: one row per rollout, kept in memory and refreshed incrementally.

A store of 1M spans takes a few hundred ms to aggregate, too slow to redo every two seconds for a page
that updates live. So the aggregate is cached with a watermark (span count, newest ``ingested_ns``):
when spans arrive, only the rollouts they belong to are aggregated again; when the count drops
(``spanrl store prune``) everything is. Filtering, sorting and counting then run on the cached rows.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from spanrl.errors import ConfigError
from spanrl.ui.source import Source

__all__ = ["RolloutFilter", "RolloutIndex", "SORT_COLUMNS"]

SORT_COLUMNS = ("start_ns", "rollout_id", "task_id", "mode", "status", "final_reward", "policy_version",
                "span_count", "duration_ms", "error_count")
STATUSES = ("finished", "error", "open")

# status as the store's `rollouts` view defines it (store/views.sql); rewards from the `rewards` view
_AGGREGATE_SQL = """
WITH s AS (
    SELECT rollout_id,
           any_value(task_id) AS task_id,
           max(attempt) AS attempt,
           any_value(mode) AS mode,
           min(start_ns) AS start_ns,
           max(end_ns) AS end_ns,
           count(*) AS span_count,
           count(*) FILTER (WHERE status_code = 'ERROR') AS error_count,
           bool_or(name = 'spanrl.rollout') AS has_rollout_span,
           bool_or(name = 'spanrl.rollout' AND status_code = 'ERROR') AS rollout_failed,
           max(policy_version) AS policy_version,
           string_agg(DISTINCT agent_name, ', ' ORDER BY agent_name) AS agents,
           count(*) FILTER (WHERE operation_name IN ('chat', 'text_completion')) AS llm_spans
    FROM spans
    WHERE rollout_id IS NOT NULL __FILTER__
    GROUP BY rollout_id
), r AS (
    SELECT rollout_id, arg_max(value, time_ns) AS final_reward, count(*) AS reward_count
    FROM rewards
    WHERE rollout_id IS NOT NULL __FILTER__
    GROUP BY rollout_id
)
SELECT s.rollout_id, s.task_id, s.attempt, s.mode,
       CASE WHEN s.rollout_failed THEN 'error' WHEN s.has_rollout_span THEN 'finished' ELSE 'open' END AS status,
       r.final_reward, coalesce(r.reward_count, 0) AS reward_count, s.policy_version, s.agents,
       s.span_count, s.error_count, s.llm_spans, s.start_ns, s.end_ns,
       (s.end_ns - s.start_ns) / 1e6 AS duration_ms
FROM s LEFT JOIN r USING (rollout_id)
"""
_CHANGED = "AND rollout_id IN (SELECT DISTINCT rollout_id FROM spans WHERE ingested_ns >= $since)"
_WATERMARK_SQL = "SELECT count(*) AS n, max(ingested_ns) AS newest FROM spans"


@dataclass
class RolloutFilter:
    """What the rollouts page asks for; every field optional."""

    status: str | None = None
    mode: str | None = None
    text: str | None = None
    """Substring of the rollout id, task id or agent names (case-insensitive)."""
    sort: str = "start_ns"
    descending: bool = True
    limit: int = 200
    offset: int = 0

    def validate(self) -> "RolloutFilter":
        if self.status is not None and self.status not in STATUSES:
            raise ConfigError(f"status must be one of {', '.join(STATUSES)}; got {self.status!r}")
        if self.sort not in SORT_COLUMNS:
            raise ConfigError(f"sort must be one of {', '.join(SORT_COLUMNS)}; got {self.sort!r}")
        if not 1 <= self.limit <= 5000:
            raise ConfigError(f"limit must be between 1 and 5000; got {self.limit!r}")
        if self.offset < 0:
            raise ConfigError(f"offset must be >= 0; got {self.offset!r}")
        return self


class RolloutIndex:
    """The cached per-rollout aggregate of one `Source`; thread-safe."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._table: pa.Table | None = None
        self._count = -1
        self._newest: int | None = None
        self._local = duckdb.connect(":memory:")

    def refresh(self) -> pa.Table:
        """Bring the cache up to date with the store; return it."""
        with self._lock:
            row = self._source.sql(_WATERMARK_SQL).to_pylist()[0]
            count, newest = int(row["n"]), row["newest"]
            if self._table is not None and count == self._count and newest == self._newest:
                return self._table
            if self._table is None or count < self._count or self._newest is None:
                self._table = self._source.sql(_AGGREGATE_SQL.replace("__FILTER__", ""))
            else:
                changed = self._source.sql(_AGGREGATE_SQL.replace("__FILTER__", _CHANGED), {"since": self._newest})
                self._table = self._merge(self._table, changed)
            self._count, self._newest = count, newest
            return self._table

    def _merge(self, old: pa.Table, changed: pa.Table) -> pa.Table:
        if changed.num_rows == 0:
            return old
        cur = self._local.cursor()
        try:
            cur.register("old_rows", old)
            cur.register("changed_rows", changed.cast(old.schema))
            return cur.sql(
                "SELECT * FROM old_rows WHERE rollout_id NOT IN (SELECT rollout_id FROM changed_rows) "
                "UNION ALL SELECT * FROM changed_rows"
            ).to_arrow_table()
        finally:
            cur.close()

    def query(self, flt: RolloutFilter) -> dict[str, Any]:
        """Counts by status (of everything that passes the mode and text filters), the total that
        passes every filter, and one page of rows."""
        flt.validate()
        table = self.refresh()
        clauses, params = ["TRUE"], {}
        if flt.mode:
            clauses.append("coalesce(mode, 'train') = $mode")
            params["mode"] = flt.mode
        if flt.text:
            clauses.append("(rollout_id ILIKE $text OR task_id ILIKE $text OR agents ILIKE $text)")
            params["text"] = f"%{flt.text}%"
        where = " AND ".join(clauses)
        cur = self._local.cursor()
        try:
            cur.register("r", table)
            counts = {s: 0 for s in STATUSES}
            for status, n in cur.sql(f"SELECT status, count(*) FROM r WHERE {where} GROUP BY status", params=params).fetchall():
                counts[status] = n
            if flt.status:
                where += " AND status = $status"
                params["status"] = flt.status
            total = cur.sql(f"SELECT count(*) FROM r WHERE {where}", params=params).fetchall()[0][0]
            order = f"{flt.sort} {'DESC' if flt.descending else 'ASC'} NULLS LAST, rollout_id"
            rows = cur.sql(
                f"SELECT * FROM r WHERE {where} ORDER BY {order} LIMIT {flt.limit} OFFSET {flt.offset}", params=params
            ).to_arrow_table().to_pylist()
        finally:
            cur.close()
        return {"counts": counts, "total": total, "rows": rows}

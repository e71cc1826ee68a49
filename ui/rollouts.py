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
import pyarrow.compute as pc

from spanrl.errors import ConfigError, one_of
from spanrl.ui.source import Source

__all__ = ["RolloutFilter", "RolloutIndex", "SORT_COLUMNS"]

SORT_COLUMNS = ("start_ns", "rollout_id", "task_id", "mode", "status", "final_reward", "policy_version",
                "span_count", "duration_ms", "error_count")
STATUSES = ("finished", "error", "open")

# Status, attribution and rewards by the store's one definition (store/views.sql: rollout_state,
# rollout_spans, rollout_rewards), over spans ingested at or after $since, for the rollouts __FILTER__
# keeps. first_ns, last_ingested_ns and rewarded are kept for the next refresh, never shown.
_AGGREGATE_SQL = """
WITH x AS (
    SELECT rollout_id, max(policy_version) AS policy_version,
           string_agg(DISTINCT agent_name, ', ' ORDER BY agent_name) AS agents,
           count(*) FILTER (WHERE operation_name IN ('chat', 'generate_content', 'text_completion')) AS llm_spans,
           min(ingested_ns) AS first_ns
    FROM rollout_spans($since)
    WHERE rollout_id IS NOT NULL __FILTER__
    GROUP BY rollout_id
), r AS (
    -- the rollouts view's rule
    SELECT rollout_id, arg_max(value, [ingested_ns, time_ns]) AS final_reward, count(*) AS reward_count
    FROM rollout_rewards($since)
    WHERE rollout_id IS NOT NULL __FILTER__
    GROUP BY rollout_id
)
SELECT s.rollout_id, s.task_id, s.attempt, s.mode, s.status, s.ended_by,
       r.final_reward, coalesce(r.reward_count, 0) AS reward_count, x.policy_version, x.agents,
       s.span_count, s.error_count, x.llm_spans, s.start_ns, s.end_ns,
       (s.end_ns - s.start_ns) / 1e6 AS duration_ms,
       x.first_ns, s.last_ingested_ns, s.rewarded
FROM rollout_state($since) s JOIN x USING (rollout_id) LEFT JOIN r USING (rollout_id)
WHERE TRUE __FILTER__
"""
_HIDDEN = ("first_ns", "last_ingested_ns", "rewarded")
_CHANGED = "AND list_contains($ids, rollout_id)"
# The store's clock less the quiet period: an open, rewarded rollout silent since before it has
# finished by the quiet rule without any new span, so it is aggregated again.
_WATERMARK_SQL = ("SELECT count(*) AS n, max(ingested_ns) AS newest, "
                  "epoch_ns(now()) - rollout_quiet_ns() AS quiet_before FROM spans")
# The rollouts that spans ingested at or after $since may change: the own ids in every trace they
# touch (a span without an id joins its trace's rollout), and the oldest ingestion in those traces;
# whether a reward without an id came (cheap: only the new spans are read), and then the rollouts that such
# verdicts resolve to (views.sql's rollout_rewards, keys read over the whole store: a verdict from
# elsewhere names older spans), which are aggregated from their first span.
_TOUCHED_SQL = """
WITH t AS (SELECT DISTINCT trace_id FROM spans WHERE ingested_ns >= $since)
SELECT list(DISTINCT rollout_id) FILTER (WHERE rollout_id IS NOT NULL) AS ids, min(ingested_ns) AS oldest,
       (SELECT count(*) > 0 FROM spans WHERE ingested_ns >= $since AND rollout_id IS NULL
            AND (reward_value IS NOT NULL OR contains(events, 'gen_ai.evaluation.result')
                 OR contains(events, 'spanrl.reward'))) AS verdicts
FROM spans WHERE trace_id IN (SELECT trace_id FROM t)
"""
_JUDGED_SQL = """
SELECT list(DISTINCT rollout_id) FILTER (WHERE rollout_id IS NOT NULL) AS judged
FROM rollout_rewards($since, usable_only := FALSE, keys_since_ns := 0) WHERE is_feedback
"""


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
        if self.status is not None:
            one_of("status", self.status, STATUSES)
        one_of("sort", self.sort, SORT_COLUMNS)
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
            due = self._quiet_due(int(row["quiet_before"]))
            if self._table is not None and count == self._count and newest == self._newest and not due:
                return self._table
            if self._table is None or count < self._count or self._newest is None:
                self._table = self._aggregate(0, None)
            else:
                self._table = self._merge(self._table, self._changed(due))
            self._count, self._newest = count, newest
            return self._table

    def _aggregate(self, since: int, ids: list[str] | None) -> pa.Table:
        sql = _AGGREGATE_SQL.replace("__FILTER__", "" if ids is None else _CHANGED)
        return self._source.sql(sql, {"since": since} if ids is None else {"since": since, "ids": ids})

    def _quiet_due(self, quiet_before: int) -> list[str]:
        """Open rollouts with a reward and no span since before ``quiet_before``: now finished by the quiet rule."""
        t = self._table
        if t is None or t.num_rows == 0:
            return []
        mask = pc.and_(pc.and_(pc.equal(t.column("status"), "open"), pc.fill_null(t.column("rewarded"), False)),
                       pc.less(t.column("last_ingested_ns"), quiet_before))
        return t.filter(mask).column("rollout_id").to_pylist()

    def _changed(self, due: list[str]) -> pa.Table:
        """The rows of the rollouts that spans since the watermark touch (and of ``due``), aggregated from
        the oldest ingestion among them: the cached first span of each, or the oldest span of a touched
        trace, so every span of theirs is read and the rest of the store is not."""
        assert self._table is not None and self._newest is not None
        touched = self._source.sql(_TOUCHED_SQL, {"since": self._newest}).to_pylist()[0]
        judged: set[str] = set()
        if touched["verdicts"]:
            judged = set(self._source.sql(_JUDGED_SQL, {"since": self._newest}).to_pylist()[0]["judged"] or [])
        ids = sorted(set(touched["ids"] or []) | set(due) | judged)
        if not ids:
            return self._table.slice(0, 0)
        since = min(self._newest, touched["oldest"] if touched["oldest"] is not None else self._newest)
        cached = self._table.filter(pc.is_in(self._table.column("rollout_id"), value_set=pa.array(ids, pa.string())))
        if cached.num_rows:
            since = min(since, pc.min(cached.column("first_ns")).as_py())
        if judged - set(cached.column("rollout_id").to_pylist()):
            since = 0  # a verdict for a rollout not cached: where its spans start is not known here
        return self._aggregate(since, ids)

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
            by_status = cur.sql(f"SELECT status, count(*) FROM r WHERE {where} GROUP BY status", params=params)
            for status, n in by_status.fetchall():
                counts[status] = n
            if flt.status:
                where += " AND status = $status"
                params["status"] = flt.status
            total = cur.sql(f"SELECT count(*) FROM r WHERE {where}", params=params).fetchall()[0][0]
            order = f"{flt.sort} {'DESC' if flt.descending else 'ASC'} NULLS LAST, rollout_id"
            rows = cur.sql(
                f"SELECT * EXCLUDE ({', '.join(_HIDDEN)}) FROM r WHERE {where} "
                f"ORDER BY {order} LIMIT {flt.limit} OFFSET {flt.offset}",
                params=params,

            ).to_arrow_table().to_pylist()
        finally:
            cur.close()
        return {"counts": counts, "total": total, "rows": rows}

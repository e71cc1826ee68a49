"""The kept-rollout cache: the decomposer's rows of finished rollouts, kept in the store and read back.

A rollout is decomposed once it has finished (``rollout_state``'s status is not ``open``): `materialize`
runs the decomposer's statement (store/decomposer.py) over the finished rollouts not kept yet and inserts
its result rows (calls with all columns, rewards, rollouts; ``row_kind`` tells them apart) into the
``decomposed`` table, each with

- ``version``: a hash of the decomposer's statement and views.sql, so rows kept by another spanrl are
  ignored (and dropped by the next `materialize`), never read as if this one had made them;
- ``watermark_ns``: the newest ``ingested_ns`` of the store the statement saw.

A kept rollout is *clean* while no span stored after its watermark belongs to it (views.sql's rule: its
own ``spanrl.rollout.id``, else its trace's) or shares a trace with one of its spans (a late span with
another id makes the trace ambiguous, so spans without ids leave the rollout). ``ingested_ns`` grows
with the commit order (`SpanStore.append` holds a lock from stamp to commit, whoever appends), so
"stored after the oldest watermark" is a scan that DuckDB's zone maps cut to the newest row groups. A
late span (a reward, feedback, a duplicate export) makes the rollout dirty: it is read live, and kept
again by the next `materialize`.

`read_statement` is what `decompose` runs: ONE SELECT (so it also runs through the collector's SQL
endpoint) that takes the kept rows of the selected clean rollouts and decomposes the others live, the
selection applied to kept rows as to live ones. Same rows as a live decomposition (tests/store).
`prune` (store/maintenance.py) deletes the kept rows of the rollouts whose spans it deletes.
"""

from __future__ import annotations

import hashlib
import threading
from importlib import resources
from typing import Any, Sequence

import duckdb

from spanrl.store.decomposer_sql import (
    CALL_COLUMNS, LIGHT_CALL_SQL, REWARD_COLUMNS, ROLLOUT_COLUMNS, SQL, Selection, call_filter, rollout_filter,
    statement,
)

__all__ = ["TABLE_SQL", "VERSION", "materialize", "prepare", "read_statement"]

VERSION = hashlib.sha256(
    (SQL + resources.files("spanrl.store").joinpath("views.sql").read_text(encoding="utf-8")).encode()
).hexdigest()[:16]
"""The decomposer's version key: rows kept under another are never read."""

# The decomposer's output columns and types (tests/store checks them against the statement's DESCRIBE).
_COLUMNS = (
    ("version", "VARCHAR"), ("watermark_ns", "BIGINT"), ("row_kind", "VARCHAR"), ("rollout_id", "VARCHAR"),
    ("task_id", "VARCHAR"), ("attempt", "INTEGER"), ("mode", "VARCHAR"), ("rollout_status", "VARCHAR"),
    ("agent", "VARCHAR"), ("step", "INTEGER"), ("rollout_calls", "INTEGER"), ("policy_version", "INTEGER"),
    ("rewards_after", "MAP(VARCHAR, DOUBLE)"), ("response_id", "VARCHAR"), ("status_code", "VARCHAR"),
    ("order_ns", "BIGINT"), ("agent_end_ns", "BIGINT"), ("clock_offset_ns", "BIGINT"),
    ("server_trace_id", "VARCHAR"), ("server_span_id", "VARCHAR"), ("client_trace_id", "VARCHAR"),
    ("client_span_id", "VARCHAR"), ("prompt_ids", "INTEGER[]"), ("completion_ids", "INTEGER[]"),
    ("logprobs", "FLOAT[]"), ("temperature", "DOUBLE"), ("input_messages", "VARCHAR"),
    ("output_messages", "VARCHAR"), ("name", "VARCHAR"), ("value", "DOUBLE"), ("time_ns", "BIGINT"),
    ("source", "VARCHAR"), ("ingested_ns", "BIGINT"), ("status", "VARCHAR"), ("ended_by", "VARCHAR"),
    ("start_ns", "BIGINT"),
    ("end_ns", "BIGINT"), ("span_count", "BIGINT"), ("duplicate_spans", "HUGEINT"), ("late_arrivals", "BIGINT"),
    ("orphan_calls", "BIGINT"), ("duplicate_calls", "BIGINT"), ("first_ingested_ns", "BIGINT"),
)
TABLE_SQL = f"CREATE TABLE decomposed ({', '.join(f'{n} {t}' for n, t in _COLUMNS)})"

_MATERIALIZING = threading.Lock()  # one run at a time in this process (two would delete the same rows)

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
# the rollouts `materialize` keeps: finished, not kept (the DELETE before it dropped the dirty ones)
_TO_KEEP = f"status <> 'open' AND rollout_id NOT IN (SELECT rollout_id FROM decomposed WHERE version = '{VERSION}')"
# what a rollout read live can hold: its spans after the first (rollout_spans' rule); the one row without rollout:
# the oldest LLM client span without an id (a later server span may attribute its trace), else the watermark
_OPEN_ROWS = f"""INSERT INTO decomposed BY NAME
SELECT '{VERSION}' AS version, $watermark AS watermark_ns, 'open' AS row_kind, rollout_id,
       min(ingested_ns) AS first_ingested_ns
FROM rollout_spans($since)
WHERE rollout_id IS NOT NULL
  AND rollout_id NOT IN (SELECT rollout_id FROM decomposed WHERE version = '{VERSION}' AND row_kind = 'rollout')
GROUP BY rollout_id
UNION ALL
SELECT '{VERSION}', $watermark, 'open', NULL, coalesce(min(ingested_ns), $watermark + 1)
FROM spans
WHERE ingested_ns >= $since AND rollout_id IS NULL AND response_id IS NOT NULL AND kind <> 'SERVER'"""


def _with_clean(query: str, kept_filter: str) -> str:
    """``query`` (the decomposer's statement) with the CTEs that find the clean kept rollouts first."""
    head = "WITH RECURSIVE\n"
    assert query.lstrip().startswith(head), "the decomposer's statement opens with WITH RECURSIVE"
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
    return _with_clean(live, rollout_filter(sel, params)) + kept


def materialize(store: Any) -> dict[str, int]:
    """Keep the decomposition of every finished rollout not kept yet or dirty; drop rows of other
    versions and of dirty rollouts first, and note where the open ones start. One transaction: the
    collector may write meanwhile (its spans are newer than the watermark, so their rollouts read as
    dirty). Idempotent. Returns the counts of rollouts kept now and of the rows dropped."""
    with _MATERIALIZING:
        cur = store.cursor()
        try:
            cur.begin()
            done = _keep(cur)
            cur.commit()
        except BaseException:
            cur.rollback()
            raise
        finally:
            cur.close()
    return done


def _keep(cur: duckdb.DuckDBPyConnection) -> dict[str, int]:
    # the dirty kept rollouts and where live reads start, in one pass over the spans since the last run
    dirty, since = cur.execute(_with_clean("WITH RECURSIVE\nnone AS (SELECT 1)\nSELECT (SELECT list(rollout_id) FROM "
                                           "kept_sel WHERE rollout_id NOT IN (SELECT rollout_id FROM kept_clean)), "
                                           "(SELECT since FROM live_since)", "TRUE")).fetchone()
    watermark = cur.execute("SELECT coalesce(max(ingested_ns), 0) FROM spans").fetchone()[0]
    dropped = cur.execute(f"DELETE FROM decomposed WHERE row_kind <> 'open' AND (version <> '{VERSION}' "
                          f"OR rollout_id IN (SELECT unnest($dirty::VARCHAR[])))", {"dirty": dirty or []}).fetchone()[0]
    cur.execute("DELETE FROM decomposed WHERE row_kind = 'open'")  # written again below
    count = f"SELECT count(*) FROM decomposed WHERE row_kind = 'rollout' AND version = '{VERSION}'"
    before = cur.execute(count).fetchone()[0]
    params: dict[str, Any] = {"watermark": watermark}
    live = statement(Selection(), CALL_COLUMNS, params, rollouts_also=_TO_KEEP, since=str(int(since)))
    # in the statement's order (a join here shuffled the rows: reads then sorted them by a `take`, +0.3 s)
    cur.execute(f"INSERT INTO decomposed BY NAME SELECT '{VERSION}' AS version, $watermark AS watermark_ns, * "
                f"FROM ({live})", params)
    cur.execute(f"""UPDATE decomposed d SET first_ingested_ns = f.first
FROM (SELECT rollout_id, min(ingested_ns) AS first FROM rollout_spans($since) GROUP BY ALL) f
WHERE d.row_kind = 'rollout' AND d.first_ingested_ns IS NULL AND d.rollout_id = f.rollout_id""", {"since": since})
    kept = cur.execute(count).fetchone()[0] - before
    cur.execute(_OPEN_ROWS, {"watermark": watermark, "since": since})
    return {"rollouts_kept": int(kept), "rows_dropped": int(dropped)}


def prepare(con: duckdb.DuckDBPyConnection, *, read_only: bool) -> bool:
    """Make ``decomposed`` exist with this version's columns (SpanStore.open): kept rows are a cache, so
    a table of other columns is replaced. False: a read-only store without it (reads then go live)."""
    have = con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'decomposed' "
                       "AND schema_name = 'main' AND database_name = current_database() ORDER BY column_index"
                       ).fetchall()

    if [tuple(c) for c in have] == list(_COLUMNS):
        return True
    if read_only:
        return False
    con.execute("DROP TABLE IF EXISTS decomposed")
    con.execute(TABLE_SQL)
    return True

"""The kept-rollout cache: the decomposer's rows of finished rollouts, kept in the store and read back.

A rollout is decomposed once it has finished (``rollout_state``'s status is not ``open``): `materialize`
runs the decomposer's statement (store/decomposer.py) over the finished rollouts not kept yet and inserts
its result rows (calls with all columns, rewards, rollouts; ``row_kind`` tells them apart) into the
``decomposed`` table, each with

- ``version``: the decomposer's ``VERSION`` (a hash of its statement and views.sql), so rows kept by
  another spanrl are ignored (and dropped by the next `materialize`), never read as if this one had made them;
- ``watermark_ns``: the newest ``ingested_ns`` of the store the statement saw.

A kept rollout is *clean* while no span stored after its watermark belongs to it (views.sql's rule: its
own ``spanrl.rollout.id``, else its trace's), shares a trace with one of its spans (a late span with
another id makes the trace ambiguous, so spans without ids leave the rollout), or is a verdict that
resolves to it (views.sql's ``rollout_rewards``: by response id, trace or conversation, from any trace).
``ingested_ns`` grows with the commit order (`SpanStore.append` holds a lock from stamp to commit), so
"stored after the oldest watermark" is a scan that DuckDB's zone maps cut to the newest row groups. A
late span (a reward, feedback, a duplicate export) makes the rollout dirty: it is read live, and kept
again by the next `materialize`.

This module maintains the rows; reading them is the decomposer's (store/decomposer.py: `read_statement`, and
`with_clean`, the CTEs that tell which kept rollouts are clean, which `materialize` also runs to find the dirty
ones). `prune` (store/maintenance.py) deletes the kept rows of the rollouts whose spans it deletes.
"""

from __future__ import annotations

import threading
from typing import Any

import duckdb

from spanrl.store.decomposer import CALL_COLUMNS, VERSION, Selection, statement, with_clean

__all__ = ["TABLE_SQL", "materialize", "prepare"]

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
    ("output_messages", "VARCHAR"), ("message_sources", "VARCHAR"), ("name", "VARCHAR"), ("value", "DOUBLE"),
    ("time_ns", "BIGINT"),
    ("source", "VARCHAR"), ("ingested_ns", "BIGINT"), ("status", "VARCHAR"), ("ended_by", "VARCHAR"),
    ("start_ns", "BIGINT"),
    ("end_ns", "BIGINT"), ("span_count", "BIGINT"), ("duplicate_spans", "HUGEINT"), ("late_arrivals", "BIGINT"),
    ("orphan_calls", "BIGINT"), ("duplicate_calls", "BIGINT"), ("first_ingested_ns", "BIGINT"),
)
TABLE_SQL = f"CREATE TABLE decomposed ({', '.join(f'{n} {t}' for n, t in _COLUMNS)})"

_MATERIALIZING = threading.Lock()  # one run at a time in this process (two would delete the same rows)

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
    dirty, since = cur.execute(with_clean("WITH RECURSIVE\nnone AS (SELECT 1)\nSELECT (SELECT list(rollout_id) FROM "
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

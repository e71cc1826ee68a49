"""The store's attribution and status macros (store/views.sql) on stores shaped two ways, 10 spans a rollout:

  ids      every span names its rollout and task (agents the Trainer starts, `spanrl.rollout` agents);
  no ids   production traffic without spanrl ids: one policy-server call per trace with a traceparent,
           two traces per `gen_ai.conversation.id`, the task derived from the first user message.

Timed (median of --rounds, wall): `SELECT count(*) FROM trace_rollouts(0)`, `rollout_spans(0)`,
`rollout_state(0)` and the `rollouts` view, on an in-memory DuckDB with the store's schema and views, the
spans generated in SQL. With --views-before FILE (an older views.sql) the same on it, to see what a change
to the rule costs.

Usage:
    .venv/bin/python bench/attribution.py [--rollouts 20000] [--rounds 5] [--views-before OLD_VIEWS_SQL]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import duckdb

from _results import record
from spanrl.store._spanstore import _sql_resource

_SPANS_PER_ROLLOUT = 10
_QUERIES = {
    "trace_rollouts": "SELECT count(*) FROM trace_rollouts(0)",
    "rollout_spans": "SELECT count(*) FROM rollout_spans(0)",
    "rollout_state": "SELECT count(*) FROM rollout_state(0)",
    "rollouts": "SELECT count(*), count(task_id) FROM rollouts",
}


def _fill(con: duckdb.DuckDBPyConnection, rollouts: int, *, ids: bool) -> None:
    """Span 0 of each trace is its root, span 1 the policy server's call, span 9 a reward."""
    rollout, task = ("'r' || (i // 10)", "'t' || (i // 10 % 7)") if ids else ("NULL", "NULL")
    con.execute(f"""
    INSERT INTO spans (trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, rollout_id,
                       task_id, response_id, attributes, reward_value, ingested_ns)
    SELECT md5((i // 10)::VARCHAR), left(md5(i::VARCHAR), 16),
           CASE WHEN i % 10 <> 0 THEN left(md5((i - i % 10)::VARCHAR), 16) END,
           CASE WHEN i % 10 = 1 THEN 'chat policy' ELSE 'work' END,
           CASE WHEN i % 10 = 1 THEN 'SERVER' ELSE 'INTERNAL' END, i, i + 1, 'UNSET', {rollout}, {task},
           CASE WHEN i % 10 = 1 THEN 'chatcmpl-' || (i // 10) END,
           CASE WHEN i % 10 = 1 THEN json_object(
               'gen_ai.input.messages',
               '[{{"role":"user","parts":[{{"type":"text","content":"question ' || (i // 10 % 7) || '"}}]}}]',
               'gen_ai.conversation.id', 'c' || (i // 20)) ELSE '{{}}' END,
           CASE WHEN i % 10 = 9 THEN 1.0 END, i
    FROM range({rollouts * _SPANS_PER_ROLLOUT}) t(i)""")


def _time(con: duckdb.DuckDBPyConnection, query: str, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        con.execute(query).fetchall()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--views-before", type=Path, default=None, help="an older views.sql to compare with")
    args = parser.parse_args()
    versions = {"now": _sql_resource("views.sql")}
    if args.views_before is not None:
        versions["before"] = args.views_before.read_text()
    figures = {}
    for shape, ids in (("ids", True), ("no_ids", False)):
        for version, views in versions.items():
            con = duckdb.connect()
            con.execute(_sql_resource("schema.sql"))
            _fill(con, args.rollouts, ids=ids)
            con.execute(views)
            rows = con.execute(_QUERIES["rollouts"]).fetchone()
            times = {name: _time(con, query, args.rounds) for name, query in _QUERIES.items()}
            figures.update({f"{shape}_{version}_{name}_ms": round(t * 1000, 1) for name, t in times.items()})
            print(f"{shape:6} {version:6} " + "  ".join(f"{n} {t * 1000:6.0f} ms" for n, t in times.items())
                  + f"  (rollouts {rows[0]}, with a task {rows[1]})")
            con.close()
    record("attribution", {"rollouts": args.rollouts, "spans": args.rollouts * _SPANS_PER_ROLLOUT, **figures})


if __name__ == "__main__":
    main()

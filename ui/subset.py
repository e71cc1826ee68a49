"""A few rollouts' spans copied into an in-memory store, so the decomposer and ``load_transitions``
work on hundreds of spans instead of the whole store (on 1M spans: tens of ms instead of seconds).
The copy keeps every column, ``ingested_ns`` included (late arrivals are judged by it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Sequence

import duckdb
import pyarrow as pa

from spanrl.store import SpanStore
from spanrl.store.decomposer import decompose
from spanrl.ui.source import Source

__all__ = ["Scratch", "fetch_spans"]

# Spans without spanrl.rollout.id (a policy-server span nested under the agent's trace) belong to the
# rollout of their trace, as in the decomposer. The IS NULL guard keeps DuckDB on the rollout_id filter.
_FETCH_SQL = """
WITH t AS (SELECT DISTINCT trace_id FROM spans WHERE list_contains($ids, rollout_id))
SELECT * FROM spans
WHERE list_contains($ids, rollout_id) OR (rollout_id IS NULL AND trace_id IN (SELECT trace_id FROM t))
ORDER BY start_ns, span_id
"""


def fetch_spans(source: Source, rollout_ids: Sequence[str]) -> pa.Table:
    """Every stored column of the spans of ``rollout_ids``, by start time."""
    return source.sql(_FETCH_SQL, {"ids": list(rollout_ids)})


class Scratch:
    """One in-memory span store (schema and views), refilled per use under a lock. One DuckDB thread:
    on a few hundred spans, planning dominates and more threads only contend."""

    def __init__(self) -> None:
        self._store = SpanStore.open(":memory:", threads=1)
        self._lock = threading.Lock()
        with self.holding(pa.table({})) as cur:
            decompose(cur)  # the first plan of the decomposer's statement is the slow one

    @contextmanager
    def holding(self, spans: pa.Table) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor on a store that holds exactly ``spans`` (any subset of the spans columns)."""
        with self._lock:
            cur = self._store.cursor()
            try:
                cur.execute("DELETE FROM spans")
                if spans.num_columns:
                    cur.register("__ui_rows", spans)
                    cur.execute("INSERT INTO spans BY NAME SELECT * FROM __ui_rows")
                    cur.unregister("__ui_rows")
                yield cur
            finally:
                cur.close()

    def close(self) -> None:
        self._store.close()

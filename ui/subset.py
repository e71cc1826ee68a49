"""A few rollouts' spans copied into an in-memory store, so the decomposer and ``load_transitions``
work on hundreds of spans instead of the whole store (on 1M spans: tens of ms instead of seconds).
The copy keeps every column, ``ingested_ns`` included (late arrivals are judged by it)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from spanrl.store import SpanStore
from spanrl.store.decomposer import Decomposition, Selection, decompose
from spanrl.ui.source import Source

__all__ = ["Scratch", "fetch_spans", "version_of"]

_REMEMBERED = 64  # results kept (the rollout page asks twice: spans, then credit; people go back and forth)

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


def version_of(spans: pa.Table) -> tuple[int, int | None]:
    """(row count, newest ``ingested_ns``): changes whenever spans are added or pruned."""
    return spans.num_rows, (pc.max(spans.column("ingested_ns")).as_py() if spans.num_rows else None)


class Scratch:
    """One in-memory span store (schema and views), refilled per use under a lock. One DuckDB thread:
    on a few hundred spans, planning dominates and more threads only contend."""

    def __init__(self) -> None:
        self._store = SpanStore.open(":memory:", threads=1)
        self._lock = threading.Lock()
        self._remembered: OrderedDict[tuple, Decomposition] = OrderedDict()
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

    def remember(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``, remembered under ``key`` (which must change when the spans do)."""
        with self._lock:
            if key in self._remembered:
                self._remembered.move_to_end(key)
                return self._remembered[key]
        value = compute()
        with self._lock:
            self._remembered[key] = value
            while len(self._remembered) > _REMEMBERED:
                self._remembered.popitem(last=False)
        return value

    def decompose_rollout(self, spans: pa.Table, rollout_id: str) -> Decomposition:
        """The decomposer's view of one rollout among ``spans``; remembered until its spans change
        (their count or newest ``ingested_ns``), since the decomposer's statement is the slow part."""
        own = pc.fill_null(pc.equal(spans.column("rollout_id"), rollout_id), False)
        traces = pc.unique(spans.filter(own).column("trace_id"))
        inherited = pc.and_(pc.is_null(spans.column("rollout_id")), pc.is_in(spans.column("trace_id"), value_set=traces))
        mine = spans.filter(pc.or_(own, inherited))  # as fetch_spans assigns them

        def compute() -> Decomposition:
            with self.holding(spans) as cur:
                return decompose(cur, Selection(rollout_ids=[rollout_id]))

        return self.remember(("decompose", rollout_id, *version_of(mine)), compute)

    def close(self) -> None:
        self._store.close()

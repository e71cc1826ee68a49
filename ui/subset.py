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

# The spans a rollout's attribution can depend on (store/views.sql's rollout_spans): every span of each
# trace holding one of its own spans or linked to one of its server spans by gen_ai.response.id, and
# the server spans (of any rollout) those linked traces' calls name (the ambiguity check needs them).
_CANDIDATES_SQL = """
WITH own AS (SELECT trace_id, response_id, kind FROM spans WHERE list_contains($ids, rollout_id)),
linked AS (
    SELECT DISTINCT trace_id FROM spans
    WHERE kind <> 'SERVER' AND rollout_id IS NULL
      AND response_id IN (SELECT response_id FROM own WHERE kind = 'SERVER' AND response_id IS NOT NULL)
), traces AS (SELECT trace_id FROM own UNION SELECT trace_id FROM linked),
named AS (
    SELECT response_id FROM spans
    WHERE trace_id IN (SELECT trace_id FROM linked) AND kind <> 'SERVER' AND response_id IS NOT NULL
), picked AS (  -- row ids first: an OR of IN-lists over every column would read the whole table
    SELECT rowid AS r FROM spans WHERE trace_id IN (SELECT trace_id FROM traces)
    UNION
    SELECT rowid FROM spans
    WHERE kind = 'SERVER' AND rollout_id IS NOT NULL AND response_id IN (SELECT response_id FROM named)
)
SELECT * FROM spans WHERE rowid IN (SELECT r FROM picked)
"""
# Those candidates attributed by the one rule, in a store of their own: each span's rollout_id is the
# rollout it belongs to (its own id, else its trace's).
_ATTRIBUTED_SQL = """
SELECT * EXCLUDE (rid) FROM rollout_spans(0) WHERE list_contains($ids, rollout_id) ORDER BY start_ns, span_id
"""
_attribution: tuple[SpanStore, threading.Lock] | None = None
_attribution_lock = threading.Lock()
_attributed: OrderedDict[tuple, pa.Table] = OrderedDict()  # by ids and candidates' version: pages are reopened


def fetch_spans(source: Source, rollout_ids: Sequence[str]) -> pa.Table:
    """Every stored column of the spans of ``rollout_ids`` (attributed as store/views.sql's
    ``rollout_spans`` does; ``rollout_id`` is the rollout each belongs to), by start time."""
    global _attribution
    ids = list(rollout_ids)
    candidates = source.sql(_CANDIDATES_SQL, {"ids": ids})
    key = (tuple(ids), *version_of(candidates))
    with _attribution_lock:
        if key in _attributed:
            _attributed.move_to_end(key)
            return _attributed[key]
        if _attribution is None:
            _attribution = (SpanStore.open(":memory:", threads=1), threading.Lock())
        store, lock = _attribution
    with lock:
        cur = store.cursor()
        try:
            cur.execute("DELETE FROM spans")
            if candidates.num_rows:
                cur.register("__ui_candidates", candidates)
                cur.execute("INSERT INTO spans BY NAME SELECT * FROM __ui_candidates")
                cur.unregister("__ui_candidates")
            table = cur.sql(_ATTRIBUTED_SQL, params={"ids": ids}).to_arrow_table()
        finally:
            cur.close()
    with _attribution_lock:
        _attributed[key] = table
        while len(_attributed) > _REMEMBERED:
            _attributed.popitem(last=False)
    return table


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
            decompose(cur, kept=False)  # the first plan of the decomposer's statement is the slow one

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
        # fetch_spans attributed them
        mine = spans.filter(pc.fill_null(pc.equal(spans.column("rollout_id"), rollout_id), False))


        def compute() -> Decomposition:
            with self.holding(spans) as cur:
                return decompose(cur, Selection(rollout_ids=[rollout_id]), kept=False)  # nothing kept here

        return self.remember(("decompose", rollout_id, *version_of(mine)), compute)

    def close(self) -> None:
        self._store.close()

"""Decomposed rollouts (store/kept_rollouts.py): kept rows read back give exactly the live decomposition.

Every decomposer test of test_decomposer.py runs again here with each of its `decompose` calls checked:
live, then `materialize`, then read with the kept rows: identical tables. Then what makes kept rows
stale: a late span, a version change, prune; and the collector keeping rows by itself.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import pyarrow as pa
import pytest

import test_decomposer as cases
from test_decomposer import Recorder, Rollout, deliver, rows
from spanrl.store import RemoteStore, SpanStore, kept_rollouts, prune
from spanrl.store.decomposer import CALL_COLUMNS, VERSION, Decomposition, Selection, decompose, statement


@pytest.fixture
def collector(tmp_path: Any) -> Any:
    """A collector without its background materializer: these tests run ``materialize`` themselves and count
    what it keeps, which the collector's own thread (every 2 s) would race (it kept b first in 3 of 5 loaded
    runs: ``rollouts_kept`` 0 instead of 1)."""
    from spanrl.collector import Collector, CollectorConfig

    c = Collector(CollectorConfig(db_path=str(tmp_path / "spans.duckdb"), grpc_port=0, http_port=0,
                                  materialize_interval_s=None)).start()
    try:
        yield c
    finally:
        c.shutdown()


def _canonical(table: pa.Table) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in table.to_pylist())  # rewards may tie on their sort keys


def assert_same(a: Decomposition, b: Decomposition) -> None:
    for part in ("calls", "rewards", "rollouts"):
        x, y = getattr(a, part), getattr(b, part)
        assert x.schema == y.schema, part
        assert _canonical(x) == _canonical(y), part
    assert a.report == b.report


def _checked_decompose(con: Any, selection: Selection | None = None, **kw: Any) -> Decomposition:
    """The live decomposition, checked against a read from kept rows after `materialize`."""
    live = decompose(con, selection, kept=False, **kw)
    kept_rollouts.materialize(con)
    # was `rollouts_kept >= 0`, true of any count: now the value of a second run, idempotent (nothing new
    # to keep or drop; a materialize that re-kept clean rollouts every time reads > 0 here)
    assert kept_rollouts.materialize(con) == {"rollouts_kept": 0, "rows_dropped": 0}
    kept = decompose(con, selection, **kw)
    assert_same(live, kept)
    return kept


_CASES = [name for name, fn in inspect.getmembers(cases, inspect.isfunction)
          if name.startswith("test_") and "collector" in inspect.signature(fn).parameters]


@pytest.mark.parametrize("name", _CASES)
def test_kept_rows_read_like_live_ones(name: str, collector: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cases, "decompose", _checked_decompose)
    getattr(cases, name)(collector)
    finished = decompose(collector.store, kept=False).rollouts
    done = finished.filter(pa.compute.not_equal(finished.column("status"), "open")).num_rows
    assert _kept(collector.store) == done  # every finished rollout was kept, no open one


def _kept(store: SpanStore) -> int:
    return store.sql(f"SELECT count(*) AS n FROM decomposed WHERE row_kind = 'rollout' "
                     f"AND version = '{VERSION}'").column("n")[0].as_py()


def _two_rollouts(collector: Any) -> tuple[Recorder, Rollout]:
    rec = Recorder()
    for rid in ("a", "b"):
        r = Rollout(rec, rid)
        root = r.root(0, 100)
        agent = r.invoke_agent("solver", root, 1, 99)
        r.call(agent, 10, [1, 2], [3])
        r.reward(agent, 50, 1.0)
    deliver(collector, rec.spans())
    return rec, r


def test_a_late_span_makes_its_rollout_dirty_until_kept_again(collector: Any) -> None:
    store = collector.store
    _, b = _two_rollouts(collector)
    assert kept_rollouts.materialize(store) == {"rollouts_kept": 2, "rows_dropped": 0}
    assert kept_rollouts.materialize(store) == {"rollouts_kept": 0, "rows_dropped": 0}  # idempotent
    late = Recorder()
    b.rec = late
    b.agent = late.tracer("agent", **{"spanrl.rollout.id": "b"})
    b.reward(None, 80, 0.5, name="feedback")  # a late reward, a trace of its own
    deliver(collector, late.spans())

    dec = decompose(store)
    assert_same(dec, decompose(store, kept=False))
    assert rows(dec.rewards, "rollout_id", "name", "value") == [("a", "reward", 1.0), ("b", "reward", 1.0),
                                                               ("b", "feedback", 0.5)]
    assert kept_rollouts.materialize(store)["rollouts_kept"] == 1  # b again; its old rows were dropped
    assert_same(decompose(store), decompose(store, kept=False))


def test_a_span_without_id_in_a_kept_trace_makes_it_dirty(collector: Any) -> None:
    store = collector.store
    _two_rollouts(collector)
    kept_rollouts.materialize(store)
    trace_id, parent = store.sql("SELECT trace_id, span_id FROM spans WHERE rollout_id = 'a' "
                                 "AND name = 'spanrl.rollout'").to_pylist()[0].values()
    store.sql("INSERT INTO spans BY NAME SELECT * REPLACE (md5(span_id)[:16] AS span_id, NULL AS rollout_id, "
              "? AS parent_span_id, 7.0 AS reward_value, epoch_ns(now()) AS ingested_ns) "
              "FROM spans WHERE trace_id = ? AND name = 'spanrl.reward'", [parent, trace_id])
    dec = decompose(store)
    assert_same(dec, decompose(store, kept=False))
    assert sorted(v for r, v in rows(dec.rewards, "rollout_id", "value") if r == "a") == [1.0, 7.0]


def test_a_rollout_open_at_the_last_run_and_a_new_one_read_live_in_full(collector: Any) -> None:
    """Reads decompose live only the spans after the oldest start of a rollout open at the last run."""
    store = collector.store
    rec = Recorder()
    running = Rollout(rec, "running")
    agent = running.invoke_agent("solver", None, 1, 99)
    running.call(agent, 10, [1], [2])
    deliver(collector, rec.spans())
    _two_rollouts(collector)  # finished after the open one started
    kept_rollouts.materialize(store)
    later = Recorder()
    running.rec, running.agent = later, later.tracer("agent", **{"spanrl.rollout.id": "running"})
    running.root(0, 100)  # it ends now
    fresh = Rollout(later, "fresh")
    fresh.call(fresh.root(0, 100), 10, [5], [6])
    deliver(collector, later.spans())

    dec = decompose(store)
    assert_same(dec, decompose(store, kept=False))
    assert rows(dec.rollouts, "rollout_id", "status", "span_count") == [
        ("a", "finished", 5), ("b", "finished", 5), ("fresh", "finished", 3), ("running", "finished", 4)]
    assert kept_rollouts.materialize(store)["rollouts_kept"] == 2
    assert_same(decompose(store), decompose(store, kept=False))


def test_a_client_span_without_id_stored_before_its_server_span_reads_live(collector: Any) -> None:
    """A trace without rollout ids is attributed by response id when the server span comes (views.sql):
    its older client span must still be read with the rollout then."""
    store = collector.store
    rec = Recorder()
    anonymous = rec.tracer("agent")  # no spanrl.rollout.id anywhere
    rec.span(anonymous, "openai.chat", start_ns=cases._ns(10), end_ns=cases._ns(20), kind=cases.SpanKind.CLIENT,
             attributes={"gen_ai.operation.name": "chat", "gen_ai.response.id": "chatcmpl-x"})
    deliver(collector, rec.spans())
    _two_rollouts(collector)
    kept_rollouts.materialize(store)
    later = Recorder()
    server = later.tracer(cases.POLICY_SERVICE)
    later.span(server, "chat tiny", start_ns=cases._ns(11), end_ns=cases._ns(19), kind=cases.SpanKind.SERVER,
               attributes={"gen_ai.operation.name": "chat", "gen_ai.response.id": "chatcmpl-x",
                           "spanrl.rollout.id": "linked", "spanrl.llm.prompt_token_ids": [1],
                           "spanrl.llm.completion_token_ids": [2], "spanrl.llm.logprobs": [-0.5]})
    later.span(later.tracer("agent", **{"spanrl.rollout.id": "linked"}), "spanrl.rollout",
               start_ns=cases._ns(0), end_ns=cases._ns(30))
    deliver(collector, later.spans())

    dec = decompose(store)
    assert_same(dec, decompose(store, kept=False))
    linked = [r for r in dec.calls.to_pylist() if r["rollout_id"] == "linked"]
    assert len(linked) == 1 and linked[0]["client_span_id"] is not None  # paired with the older client span


def test_rows_kept_by_another_version_are_ignored_and_dropped(collector: Any) -> None:
    store = collector.store
    _two_rollouts(collector)
    kept_rollouts.materialize(store)
    store.sql("UPDATE decomposed SET version = 'older', prompt_ids = [0], value = 99.0")  # what an old spanrl kept
    dec = decompose(store)
    assert_same(dec, decompose(store, kept=False))
    assert rows(dec.calls, "prompt_ids") == [([1, 2],), ([1, 2],)]
    assert kept_rollouts.materialize(store) == {"rollouts_kept": 2, "rows_dropped": 2 * 3}
    assert store.sql("SELECT count(*) AS n FROM decomposed WHERE version = 'older'").column("n")[0].as_py() == 0


def test_prune_deletes_the_kept_rows_of_the_rollouts_it_deletes(collector: Any) -> None:
    store = collector.store
    _two_rollouts(collector)
    kept_rollouts.materialize(store)
    assert _kept(store) == 2
    assert prune(store, 0, now_ns=cases.T0_NS + 10**12) > 0  # every rollout ended before then
    assert store.sql("SELECT count(*) AS n FROM decomposed").column("n")[0].as_py() == 0
    assert decompose(store).rollouts.num_rows == 0


def test_table_columns_are_the_statements_output(tmp_path: Any) -> None:
    with SpanStore.open(tmp_path / "s.duckdb") as store:
        described = store.sql(f"DESCRIBE {statement(Selection(), CALL_COLUMNS, {})}")
        table = store.sql("DESCRIBE decomposed")
    out = list(zip(described.column("column_name").to_pylist(), described.column("column_type").to_pylist()))
    kept = list(zip(table.column("column_name").to_pylist(), table.column("column_type").to_pylist()))
    assert kept == [("version", "VARCHAR"), ("watermark_ns", "BIGINT")] + out + [("first_ingested_ns", "BIGINT")]


def test_a_read_only_store_without_the_table_reads_live(tmp_path: Any) -> None:
    path = tmp_path / "old.duckdb"
    with SpanStore.open(path) as store:
        store.sql("DROP TABLE decomposed")  # a file written before kept rows existed
    with SpanStore.open(path, read_only=True) as store:
        assert decompose(store).rollouts.num_rows == 0


def test_the_collector_keeps_finished_rollouts_and_its_sql_endpoint_reads_them(tmp_path: Any) -> None:
    from spanrl.collector import Collector, CollectorConfig

    cfg = CollectorConfig(db_path=str(tmp_path / "spans.duckdb"), grpc_port=0, http_port=0, materialize_interval_s=0.1)
    with Collector(cfg).start() as collector:
        _two_rollouts(collector)
        deadline = time.monotonic() + 20
        while _kept(collector.store) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _kept(collector.store) == 2
        remote = RemoteStore(collector.http_endpoint)
        assert_same(decompose(remote), decompose(remote, kept=False))
        collector.store.sql("UPDATE decomposed SET value = 42.0 WHERE row_kind = 'reward'")  # only kept rows say so
        assert rows(decompose(remote).rewards, "value") == [(42.0,), (42.0,)]
        assert rows(decompose(remote, kept=False).rewards, "value") == [(1.0,), (1.0,)]

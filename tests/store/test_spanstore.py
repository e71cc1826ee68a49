"""SpanStore: schema, views, read-only SQL, the compact token encoding, export and prune."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from _otlp import b64_int32, make_request
from spanrl.collector.encoding import encode_request
from spanrl.errors import ConfigError, StoreBusyError, StoreError
from spanrl import semconv as sc
from spanrl.store import SpanStore
from spanrl.store.maintenance import export_parquet, parse_duration_s, prune


def _add(store: SpanStore, n: int = 1, *, start_ns: int | None = None, status: int = 0, events=(),
         **kwargs) -> list[str]:
    req, ids = make_request(n, **kwargs)
    for span in req.resource_spans[0].scope_spans[0].spans:
        if start_ns is not None:
            span.start_time_unix_nano = start_ns
            span.end_time_unix_nano = start_ns + 10
        span.status.code = status
        for name, t, attrs in events:
            ev = span.events.add(name=name, time_unix_nano=t)
            for k, v in attrs.items():
                ev.attributes.add(key=k).value.double_value = v
    batch = encode_request(req)
    assert batch.rejected == 0, batch.error_message
    store.append(batch.table)
    return ids


@pytest.fixture
def store():
    with SpanStore.open(":memory:") as s:
        yield s


def test_rollouts_view_one_row_per_rollout_with_status_and_final_reward(store):
    _add(store, 3, rollout_id="a", start_ns=100)
    _add(store, 1, rollout_id="a", name=sc.REWARD_SPAN_NAME, start_ns=200, attributes={sc.REWARD_VALUE: 0.2})
    _add(store, 1, rollout_id="a", name=sc.ROLLOUT_SPAN_NAME, start_ns=50,
         events=[(sc.REWARD_SPAN_NAME, 900, {sc.REWARD_VALUE: 1.0})])  # the last reward, as an event
    _add(store, 2, rollout_id="b", name=sc.ROLLOUT_SPAN_NAME, start_ns=10, status=2)
    _add(store, 2, rollout_id="c", start_ns=10)
    rows = {r["rollout_id"]: r for r in store.sql("SELECT * FROM rollouts").to_pylist()}
    assert set(rows) == {"a", "b", "c"}
    a = rows["a"]
    assert (a["span_count"], a["status"], a["final_reward"], a["reward_count"]) == (5, "finished", 1.0, 2)
    assert (a["start_ns"], a["end_ns"]) == (50, 210)
    assert (rows["b"]["status"], rows["b"]["error_count"], rows["b"]["final_reward"]) == ("error", 2, None)
    assert (rows["c"]["status"], rows["c"]["reward_count"]) == ("open", 0)


def test_rewards_view_takes_span_attributes_and_both_event_names(store):
    _add(store, 1, rollout_id="r", start_ns=1,
         attributes={sc.GEN_AI_EVALUATION_SCORE_VALUE: 0.5, sc.GEN_AI_EVALUATION_NAME: "judge"})
    _add(store, 1, rollout_id="r", start_ns=2, attributes={sc.REWARD_VALUE: 2, sc.REWARD_NAME: "steps"})
    _add(store, 1, rollout_id="r", start_ns=3,
         events=[(sc.GEN_AI_EVALUATION_RESULT_EVENT, 40, {sc.GEN_AI_EVALUATION_SCORE_VALUE: 0.9}),
                                                       ("unrelated", 41, {sc.REWARD_VALUE: 5.0})])
    rows = store.sql("SELECT name, value, source, time_ns FROM rewards ORDER BY time_ns").to_pylist()
    assert rows == [
        {"name": "judge", "value": 0.5, "source": "span", "time_ns": 11},
        {"name": "steps", "value": 2.0, "source": "span", "time_ns": 12},
        {"name": "reward", "value": 0.9, "source": "event", "time_ns": 40},
    ]


def test_llm_calls_view_and_compact_token_encoding(store):
    logprobs = np.array([-0.5, -1.25], dtype="<f4")
    _add(store, 1, rollout_id="r", attributes={
        sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "tiny", sc.GEN_AI_USAGE_INPUT_TOKENS: 3,
        sc.LLM_PROMPT_TOKEN_IDS: b64_int32([1, 2, 2**31 - 1]),
        sc.LLM_COMPLETION_TOKEN_IDS: [7, 8],
        sc.LLM_LOGPROBS: base64.b64encode(logprobs.tobytes()).decode(),
    })
    _add(store, 2, rollout_id="r")  # not LLM calls
    rows = store.sql("SELECT * FROM llm_calls").to_pylist()
    assert len(rows) == 1
    call = rows[0]
    assert call["prompt_token_ids"] == [1, 2, 2**31 - 1] and call["completion_token_ids"] == [7, 8]
    assert call["logprobs"] == [-0.5, -1.25]
    assert (call["request_model"], call["input_tokens"], call["has_token_ids"]) == ("tiny", 3, True)
    attributes = json.loads(
        store.sql("SELECT attributes FROM spans WHERE operation_name = 'chat'").column(0)[0].as_py()
    )
    assert sc.LLM_PROMPT_TOKEN_IDS not in attributes and attributes[sc.GEN_AI_REQUEST_MODEL] == "tiny"


def test_typed_columns_fall_back_to_resource_and_tolerate_wrong_types(store):
    _add(store, 1, rollout_id="res-rollout", resource={sc.TASK_ID: "t1", sc.ATTEMPT: 2},
         attributes={sc.MODE: "val", sc.POLICY_VERSION: "not a number"})
    row = store.sql("SELECT rollout_id, task_id, attempt, mode, policy_version, attributes FROM spans").to_pylist()[0]
    assert ((row["rollout_id"], row["task_id"], row["attempt"], row["mode"], row["policy_version"])
            == ("res-rollout", "t1", 2, "val", None))
    assert json.loads(row["attributes"])[sc.POLICY_VERSION] == "not a number"  # kept whole


def test_read_sql_refuses_writes_and_multiple_statements(store):
    _add(store, 2)
    with pytest.raises(StoreError, match="only read statements .* got INSERT"):
        store.read_sql("INSERT INTO spans SELECT * FROM spans")
    with pytest.raises(StoreError, match="got DROP"):
        store.read_sql("DROP TABLE spans")
    with pytest.raises(StoreError, match="exactly one SQL statement is allowed, got 2"):
        store.read_sql("SELECT 1; DELETE FROM spans")
    with pytest.raises(StoreError, match="does not parse"):
        store.read_sql("SELEC oops")
    assert store.read_sql("SELECT count(*) AS n FROM spans WHERE name = ?", ["span"]).to_pylist() == [{"n": 2}]
    assert store.span_count() == 2


def test_open_read_only_missing_file_is_store_error(tmp_path):
    with pytest.raises(StoreError, match="no span store at .*missing.duckdb"):
        SpanStore.open(tmp_path / "missing.duckdb", read_only=True)


def test_file_held_by_another_process_is_store_busy(tmp_path):
    db = tmp_path / "held.duckdb"
    SpanStore.open(db).close()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, duckdb
        con = duckdb.connect({str(db)!r})
        print("held", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreBusyError, match="held by another process"):
            SpanStore.open(db, read_only=True)
        cli = subprocess.run([sys.executable, "-m", "spanrl", "sql", "SELECT 1", "--db", str(db),
                              "--url", "http://127.0.0.1:9"],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 1 and "held by another process and no collector answered" in cli.stderr
    finally:
        holder.stdin.close()
        holder.wait(30)


def test_export_parquet_writes_spans_and_views(tmp_path):
    with SpanStore.open(tmp_path / "s.duckdb") as s:
        _add(s, 4, rollout_id="x", attributes={sc.LLM_PROMPT_TOKEN_IDS: [1, 2], sc.GEN_AI_OPERATION_NAME: "chat"})
        paths = export_parquet(s, tmp_path / "out")
    assert (sorted(p.name for p in paths)
            == ["llm_calls.parquet", "rewards.parquet", "rollouts.parquet", "spans.parquet"])
    spans = pq.read_table(tmp_path / "out" / "spans.parquet")
    assert spans.num_rows == 4 and spans.column("prompt_token_ids").to_pylist()[0] == [1, 2]
    assert pq.read_table(tmp_path / "out" / "rollouts.parquet").to_pylist()[0]["span_count"] == 4


def test_prune_deletes_whole_old_rollouts_only(store):
    """By ingest time (the collector's clock), whatever the sender stamped: the old rollout's spans claim
    to end in 2116 (2^62 ns) and are pruned anyway; the new one's claim 1970 and stay."""
    day = 86_400 * 10**9
    now = time.time_ns() + 100 * day
    ages = {}
    for rollout_id, n, age_days, stamp in (("old", 3, 9, 2**62), ("straddles", 2, 9, 0), ("straddles", 1, 1, 0),
                                           ("new", 2, 1, 0)):
        for span_id in _add(store, n, rollout_id=rollout_id, start_ns=stamp):
            ages[span_id] = now - age_days * day
    # as if stored that long ago: ingested_ns is the only clock prune reads
    store.sql("UPDATE spans SET ingested_ns = ages.t FROM (SELECT unnest(?) AS id, unnest(?) AS t) ages "
              "WHERE span_id = ages.id",
              [list(ages), list(ages.values())])
    assert prune(store, parse_duration_s("7d"), now_ns=now) == 3
    left = store.sql("SELECT rollout_id, count(*) AS n FROM spans GROUP BY ALL ORDER BY ALL").to_pylist()
    assert left == [{"rollout_id": "new", "n": 2}, {"rollout_id": "straddles", "n": 3}]


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800.0), ("12h", 43200.0), ("30m", 1800.0), ("45s", 45.0),
                                               ("2w", 1209600.0), ("1.5h", 5400.0)])
def test_parse_duration(text, seconds):
    assert parse_duration_s(text) == seconds


def test_parse_duration_bad_value_names_it():
    with pytest.raises(ConfigError, match=r"older_than must be .* got '7 days'"):
        parse_duration_s("7 days")


def test_append_takes_every_column_or_a_subset_by_name(store):
    """The collector's full batches take the relation-API insert, other callers' partial ones (any column
    order) the INSERT BY NAME: both store the same values and stamp ingested_ns."""
    req, _ = make_request(3, rollout_id="full", attributes={"k": 1.5})
    full = encode_request(req).table
    assert store.append(full) == 3
    part = full.select(["span_id", "trace_id", "name", "kind", "start_ns", "end_ns", "status_code", "attributes"])
    assert store.append(part) == 3
    rows = store.sql(
        "SELECT rollout_id, attributes, ingested_ns FROM spans ORDER BY rollout_id NULLS LAST, span_id"
    ).to_pylist()
    assert [r["rollout_id"] for r in rows] == ["full"] * 3 + [None] * 3
    assert all(json.loads(r["attributes"])["k"] == 1.5 and r["ingested_ns"] > 0 for r in rows)


def test_ingested_ns_grows_with_the_commit_order_across_appenders(tmp_path):
    """A reader that sees a stamp sees every older one, whoever appends: the Trainer's record_end commits
    beside the collector's writer, and store/kept_rollouts.py's watermark takes "stored after it" from the
    stamps. A small append that starts while a big one is inserting commits after it, stamped later."""
    import threading

    import pyarrow as pa

    from spanrl.store.rollouts import record_end

    req, _ = make_request(2000, rollout_id="big")
    big = pa.concat_tables([encode_request(req).table] * 100)  # 200k rows: a commit that takes a while

    class Watched:  # the append lock, noting when an appender found it held
        def __init__(self, lock: threading.Lock) -> None:
            self.lock, self.contended = lock, threading.Event()

        def __enter__(self) -> None:
            if not self.lock.acquire(blocking=False):
                self.contended.set()
                self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    with SpanStore.open(str(tmp_path / "spans.duckdb")) as store:
        lock, insert, inserting = Watched(store._append_lock), store._insert, threading.Event()

        def big_waits_for_the_small_one(cur: Any, batch: pa.Table) -> int:  # the lock held: the small one waits
            if batch.num_rows > 1:
                inserting.set()
                assert lock.contended.wait(60), "the small append never came"  # a hang guard
            return insert(cur, batch)

        store._append_lock, store._insert = lock, big_waits_for_the_small_one
        writer = threading.Thread(target=store.append, args=(big,))
        writer.start()
        assert inserting.wait(60)  # the big append holds the lock: the small one starts while it inserts
        record_end(store, "small", "agent_done")  # another appender, as the Trainer does
        seen = store.sql("SELECT max(ingested_ns) AS w, count(*) AS n FROM spans").to_pylist()[0]
        writer.join()
        after = store.sql("SELECT count(*) AS n FROM spans WHERE ingested_ns <= $w", {"w": seen["w"]}).to_pylist()[0]
        assert after["n"] == seen["n"] == big.num_rows + 1  # nothing older than what was seen came later

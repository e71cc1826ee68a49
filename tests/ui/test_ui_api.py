"""The viewer's JSON API on a real collector (in process, free ports): the live rollouts cache agrees with
the store's `rollouts` view as spans arrive, and bad input gets a 400 that names the field."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collector"))
from _otlp import make_request  # noqa: E402

from spanrl import semconv as sc  # noqa: E402
from spanrl.collector.encoding import encode_request  # noqa: E402
from spanrl.errors import StoreError  # noqa: E402
from spanrl.ui.server import UiServer  # noqa: E402
from spanrl.ui.source import open_source  # noqa: E402


def _get(url: str, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _add(collector, n: int, rollout_id: str, **kw) -> None:
    collector.store.append(encode_request(make_request(n, rollout_id=rollout_id, **kw)[0]).table)


@pytest.fixture
def ui(collector):
    server = UiServer.from_args(url=collector.http_endpoint, port=0).start()
    yield server
    server.shutdown()


def _view(collector) -> dict:
    rows = collector.store.sql("SELECT rollout_id, status, final_reward, span_count FROM rollouts").to_pylist()
    return {r["rollout_id"]: (r["status"], r["final_reward"], r["span_count"]) for r in rows}


def test_rollout_list_follows_new_spans_and_matches_the_view(collector, ui):
    _add(collector, 3, "a")
    _add(collector, 2, "b", name=sc.ROLLOUT_SPAN_NAME)
    status, first = _get(ui.url, "/api/rollouts")
    assert status == 200 and first["total"] == 2 and first["counts"] == {"finished": 1, "error": 0, "open": 1}

    _add(collector, 4, "a", attributes={sc.REWARD_VALUE: 0.5})  # more spans of "a", with a reward
    _add(collector, 1, "c", name=sc.ROLLOUT_SPAN_NAME)
    status, data = _get(ui.url, "/api/rollouts?sort=rollout_id&desc=0")
    assert [r["rollout_id"] for r in data["rows"]] == ["a", "b", "c"]
    shown = {r["rollout_id"]: (r["status"], r["final_reward"], r["span_count"]) for r in data["rows"]}
    assert shown == _view(collector)  # the incremental refresh agrees with a full aggregate
    assert shown["a"] == ("open", 0.5, 7)

    status, only = _get(ui.url, "/api/rollouts?status=finished&q=C")
    # counts follow the text filter
    assert [r["rollout_id"] for r in only["rows"]] == ["c"] and only["counts"] == {"finished": 1, "error": 0, "open": 0}


def test_bad_input_is_a_400_naming_the_field(collector, ui):
    _add(collector, 2, "z")
    assert (_get(ui.url, "/api/rollouts?status=done")
            == (400, {"error": "status must be one of finished, error, open; got 'done'"}))
    assert _get(ui.url, "/api/rollouts?limit=many") == (
        400, {"error": "the query parameter 'limit' must be an integer of at most 9223372036854775807, got 'many'"})
    # issue 53, finding 7: ?offset=1e20 (as digits, past DuckDB's BIGINT) was a 500
    for bad in ("1e20", "100000000000000000000", "9223372036854775808", "1_000", "\u0661", " 7"):
        status, doc = _get(ui.url, f"/api/rollouts?offset={urllib.parse.quote(bad)}")
        assert status == 400 and doc["error"].startswith("the query parameter 'offset' must be an integer"), (bad, doc)
    assert _get(ui.url, "/api/rollouts?offset=-1") == (400, {"error": "offset must be >= 0; got -1"})
    assert _get(ui.url, "/api/rollouts?offset=9223372036854775807")[0] == 200
    assert _get(ui.url, "/api/rollouts?sort=1;DROP") == (400, {"error": (
        "sort must be one of start_ns, rollout_id, task_id, mode, status, final_reward, policy_version, span_count, "
        "duration_ms, error_count; got '1;DROP'")})
    assert _get(ui.url, "/api/rollout?id=missing") == (404, {"error": "no spans of rollout 'missing' are stored"})
    assert _get(ui.url, "/api/nothing")[0] == 404
    assert _get(ui.url, "/static/..%2Fapp.py")[0] == 404
    request = urllib.request.Request(ui.url + "api/sql", data=b'{"sql": "DELETE FROM spans"}', method="POST",
                                     headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 400 and "only read statements" in json.loads(err.value.read())["error"]
    assert collector.store.span_count() == 2  # nothing deleted


def test_open_source_names_what_is_missing(tmp_path):
    with pytest.raises(StoreError,
                       match="no collector answered at http://127.0.0.1:9 and no span store at '.*nope.duckdb'"):
        open_source(db=str(tmp_path / "nope.duckdb"), url="http://127.0.0.1:9", token=None)


def test_rollouts_ended_by_the_trainer_show_their_end_not_open(collector, ui):
    """A command agent without spanrl never stores a spanrl.rollout span: its end is the Trainer's
    spanrl.rollout.end span (store/views.sql's rollout_state), and the list shows it once stored."""
    from spanrl.store.rollouts import record_end

    for rid in ("timed-out", "exited", "running"):
        _add(collector, 3, rid)
    status, first = _get(ui.url, "/api/rollouts")
    assert status == 200 and first["counts"] == {"finished": 0, "error": 0, "open": 3}

    record_end(collector.store, "timed-out", "timeout", error="ran past 60 s")
    record_end(collector.store, "exited", "agent_exit")
    status, data = _get(ui.url, "/api/rollouts?sort=rollout_id&desc=0")
    shown = {r["rollout_id"]: (r["status"], r["ended_by"], r["span_count"]) for r in data["rows"]}
    assert shown == {"exited": ("finished", "agent_exit", 4), "running": ("open", None, 3),
                     "timed-out": ("error", "timeout", 4)}
    assert data["counts"] == {"finished": 1, "error": 1, "open": 1}
    assert {k: v[:1] for k, v in shown.items()} == {k: (v[0],) for k, v in _view(collector).items()}
    assert "first_ns" not in data["rows"][0]  # the cache's bookkeeping is not shown


def _spans(collector, *rows: tuple[str, str | None], trace: str | None = None) -> str:
    """A span per (name, rollout id or None) in one trace (new unless given), appended as the collector
    stores them; returns the trace id."""
    import os
    import pyarrow as pa

    trace = trace or os.urandom(16).hex()
    collector.store.append(pa.Table.from_pylist([
        {"trace_id": trace, "span_id": os.urandom(8).hex(), "name": name, "kind": "INTERNAL", "start_ns": 1_000 + i,
         "end_ns": 2_000 + i, "status_code": "OK", "service_name": "agent", "rollout_id": rid}
        for i, (name, rid) in enumerate(rows)]))
    return trace


def test_a_rollout_page_shows_the_spans_the_store_attributes_to_it(collector, ui):
    """A span without a rollout id belongs to its trace's rollout, unless the trace names two (views.sql)."""
    trace_a = _spans(collector, ("root", "a"))
    _spans(collector, ("root", "b"), ("root", "c"), ("who knows", None))
    assert _get(ui.url, "/api/rollouts")[1]["total"] == 3
    _spans(collector, ("tool call", None), trace=trace_a)  # arrives later, without an id: a's by its trace
    status, a = _get(ui.url, "/api/rollout?id=a")
    assert status == 200 and sorted(s["name"] for s in a["spans"]) == ["root", "tool call"]
    status, b = _get(ui.url, "/api/rollout?id=b")
    assert status == 200 and [s["name"] for s in b["spans"]] == ["root"]
    status, rows = _get(ui.url, "/api/rollouts?sort=rollout_id&desc=0")
    assert [(r["rollout_id"], r["span_count"]) for r in rows["rows"]] == [("a", 2), ("b", 1), ("c", 1)]
    assert {r["rollout_id"]: r["span_count"] for r in rows["rows"]} == {
        r["rollout_id"]: r["span_count"] for r in collector.store.sql("SELECT * FROM rollouts").to_pylist()}


def test_a_store_that_cannot_be_reached_is_a_503_and_a_wrong_query_a_400(tmp_path):
    """Told apart by the error's class (StoreUnavailableError), not its message: once the collector is
    gone, the SQL box answers 503 with Retry-After; while it runs, a wrong query is the user's (400)."""
    from spanrl.collector import Collector, CollectorConfig

    collector = Collector(CollectorConfig(db_path=str(tmp_path / "s.duckdb"), grpc_port=0, http_port=0)).start()
    server = UiServer.from_args(url=collector.http_endpoint, port=0).start()
    try:
        def sql(query: str) -> tuple[int, dict, str | None]:
            request = urllib.request.Request(server.url + "api/sql", data=json.dumps({"sql": query}).encode(),
                                             method="POST", headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    return resp.status, {}, None
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read()), exc.headers.get("retry-after")

        status, reply, _ = sql("SELECT * FROM no_such_table")
        assert status == 400 and "no_such_table" in reply["error"]
        collector.shutdown()
        status, reply, retry = sql("SELECT 1")
        assert status == 503 and retry is not None
        assert reply["error"].startswith("the span store cannot be read right now: no collector answered at")
    finally:
        server.shutdown()
        collector.shutdown()  # safe twice


def _decomposer_helpers():
    import importlib.util

    name = "spanrl_tests_decomposer_helpers"  # the span-tree helpers of the decomposer tests, loaded by path
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).resolve().parents[1] / "store" / "test_decomposer.py")
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def _two_labelled_rollouts(collector) -> None:
    """"good" and "bad" of one task, two calls each (the second's prompt extends the first: mergeable), the first
    call labelled; rewards 1 and 0."""
    h = _decomposer_helpers()
    rec = h.Recorder()
    for rid, first, reward in (("good", True, 1.0), ("bad", False, 0.0)):
        r = h.Rollout(rec, rid, task_id="t1")
        root = r.root(0, 100)
        r.call(root, 10, [1, 2], [5], attributes={sc.LABEL_GOOD: first})
        r.call(root, 30, [1, 2, 5, 9], [7])  # unlabelled
        r.reward(root, 90, reward)
    h.deliver(collector, rec.spans())


def test_the_credit_table_shows_each_calls_label_beside_its_advantage(collector, ui):
    _two_labelled_rollouts(collector)
    status, credit = _get(ui.url, "/api/credit?id=bad")
    assert status == 200
    assert [(t["step"], t["label"], round(t["advantage"], 3)) for t in credit["transitions"]] == [
        (0, False, -0.707), (1, None, -0.707)]  # R - 0.5 over the std of [1, 0] (sqrt 0.5)


def test_a_run_that_merged_conversations_shows_each_calls_own_advantage(collector, tmp_path: Path) -> None:
    # the run trained one merged sample per conversation with per-call (discounted) credit: the table still has
    # a row per call, each with the advantage its tokens were trained with
    run = tmp_path / "grpo"
    run.mkdir()
    (run / "history.jsonl").write_text('{"step": 1}\n')
    (run / "config.json").write_text(json.dumps({"algorithm": {"name": "grpo"}, "credit": {
        "mode": "discounted", "gamma": 0.5, "trajectory_aggregation": True}}))
    server = UiServer.from_args(url=collector.http_endpoint, port=0, runs=[str(run)]).start()
    try:
        _two_labelled_rollouts(collector)
        status, credit = _get(server.url, "/api/credit?id=bad")
    finally:
        server.shutdown()
    assert status == 200 and credit["credit"]["trajectory_aggregation"] is True
    assert [(t["step"], t["label"], round(t["advantage"], 3)) for t in credit["transitions"]] == [
        (0, False, -0.354), (1, None, -0.707)]  # -0.707 (as above) x 0.5 ** (T - 1 - t) with T = 2
    assert credit["skipped"] == []

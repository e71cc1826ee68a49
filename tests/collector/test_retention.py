"""`--retention`: spans are pruned in the background by ingest time, even one stamped far in the
future (issue 28 item 9: pruning was manual only, and a span whose end_ns lay in the future was never
pruned). A real collector, real OTLP/gRPC requests, its DuckDB file."""

from __future__ import annotations

import subprocess
import sys
import time

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from _otlp import make_request
from spanrl.collector import Collector, CollectorConfig

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _send(collector, rollout_id: str, n: int, *, end_ns: int | None = None) -> None:
    req, _ = make_request(n, rollout_id=rollout_id)
    if end_ns is not None:
        for span in req.resource_spans[0].scope_spans[0].spans:
            span.end_time_unix_nano = end_ns
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        call = channel.unary_unary(_EXPORT, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        call(req.SerializeToString(), timeout=30)


def _counts(collector) -> dict[str, int]:
    rows = collector.store.sql("SELECT rollout_id, count(*) AS n FROM spans GROUP BY ALL").to_pylist()
    return {r["rollout_id"]: r["n"] for r in rows}


def test_retention_prunes_by_ingest_time_in_the_background(tmp_path, monkeypatch):
    """The collector's own pass prunes what was stored retention_s ago, by ingest time: the rollout claims to end
    in 2116, so a prune by the sender's clock would keep it, and every pass asks for retention_s (a pass that
    pruned everything would fail here). Which of two rollouts goes first is the store's test
    (tests/store/test_spanstore.py, test_prune_deletes_whole_old_rollouts_only, with the clock given); here sleeps
    would decide it."""
    from spanrl.collector import retention

    asked: list[float] = []
    prune_and_forget = retention.prune_and_forget

    def spy(store, older_than_s, claims):
        asked.append(older_than_s)
        return prune_and_forget(store, older_than_s, claims)

    monkeypatch.setattr(retention, "prune_and_forget", spy)
    config = CollectorConfig(db_path=str(tmp_path / "s.duckdb"), grpc_port=0, http_port=-1, retention_s=6.0,
                             materialize_interval_s=None)
    with Collector(config) as collector:
        _send(collector, "old", 3, end_ns=2**62)  # claims to end in 2116
        assert _counts(collector) == {"old": 3}
        deadline = time.monotonic() + 120  # a hang guard: the pass runs every 0.6 s
        while _counts(collector) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _counts(collector) == {}
    assert asked and set(asked) == {6.0}


def test_retention_flag_is_a_duration(tmp_path):
    ran = subprocess.run([sys.executable, "-m", "spanrl", "collector", "--db", str(tmp_path / "s.duckdb"),
                          "--retention", "7 years"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2 and ran.stderr.endswith(
        "spanrl: error: --retention must be a number and a unit s/m/h/d/w (e.g. 7d), got '7 years'\n")

"""Group commit and back-pressure of the batcher, and how receivers report a full queue."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import grpc
import pyarrow as pa
import pytest
from google.rpc import status_pb2
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from _otlp import make_request
from spanrl.trust import Tokens
from spanrl.collector.admission import Admission
from spanrl.collector.batcher import Batcher, BatcherConfig
from spanrl.collector.encoding import encode_request
from spanrl.collector.errors import RetryableError
from spanrl.collector.grpc import GrpcReceiver
from spanrl.collector.http import HttpReceiver, OtlpHttpApp
from spanrl.collector.sql import SqlRunner
from spanrl.errors import ConfigError
from spanrl.store import SpanStore


class GatedConsumer:
    """In-memory stand-in for the DuckDB writer that commits only when the gate opens."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.transactions: list[int] = []

    def consume(self, tables: list[pa.Table]) -> None:
        self.entered.set()
        self.gate.wait(30)
        self.transactions.append(sum(t.num_rows for t in tables))


def _batch(n: int):
    return encode_request(make_request(n)[0])


def test_queued_requests_share_one_commit():
    consumer = GatedConsumer()
    batcher = Batcher(BatcherConfig(), consumer)
    batcher.start()
    first = batcher.consume(_batch(10))
    assert consumer.entered.wait(10)
    later = [batcher.consume(_batch(10)) for _ in range(5)]  # queue while the first commit runs
    assert not any(f.done() for f in [first, *later])  # nothing acknowledged before its commit
    consumer.gate.set()
    assert [f.result(10) for f in [first, *later]] == [10] * 6
    assert consumer.transactions == [10, 50]
    batcher.shutdown(10)


def test_full_queue_refuses_with_retryable_error_and_keeps_accepted():
    consumer = GatedConsumer()
    one = _batch(100)
    batcher = Batcher(BatcherConfig(max_queue_bytes=int(one.table.nbytes * 2.5)), consumer)
    batcher.start()
    accepted = [batcher.consume(_batch(100))]
    assert consumer.entered.wait(10)  # the first is being committed: its bytes still count
    accepted.append(batcher.consume(_batch(100)))  # 2 of 2.5 batches
    with pytest.raises(RetryableError, match="write queue full") as err:
        batcher.consume(_batch(100))
    assert err.value.retry_after_s == 1
    consumer.gate.set()
    assert all(f.result(10) == 100 for f in accepted)
    batcher.shutdown(10)
    assert sum(consumer.transactions) == 100 * len(accepted)


def test_shutdown_commits_queued_then_refuses():
    consumer = GatedConsumer()
    batcher = Batcher(BatcherConfig(), consumer)
    batcher.start()
    futures = [batcher.consume(_batch(5)) for _ in range(4)]
    consumer.gate.set()
    batcher.shutdown(10)
    assert [f.result(0) for f in futures] == [5] * 4
    with pytest.raises(RetryableError, match="not accepting"):
        batcher.consume(_batch(1))
    batcher.shutdown(10)  # twice is fine


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("max_queue_bytes", 0, "max_queue_bytes must be at least 1, got 0"),
     ("max_batch_spans", -5, "max_batch_spans must be at least 1, got -5"),
     ("retry_after_s", -1, "retry_after_s must be 0 or more, got -1")],
)
def test_bad_batcher_config_names_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        BatcherConfig(**{field: value}).validate()


def test_receivers_answer_full_queue_with_unavailable_and_503_retry_after(tmp_path):
    consumer = GatedConsumer()
    batch_bytes = _batch(50).table.nbytes
    batcher = Batcher(BatcherConfig(max_queue_bytes=batch_bytes, retry_after_s=7), consumer)
    batcher.start()
    blocker = batcher.consume(_batch(50))  # holds the queue: nothing else fits
    assert consumer.entered.wait(10)
    store = SpanStore.open(":memory:")
    admission = Admission(max_requests=8, max_bytes=1 << 30, retry_after_s=7)
    sql = SqlRunner(store, workers=1, max_waiting=2, timeout_s=5, retry_after_s=7, max_rows=1000, max_bytes=1 << 20)
    grpc_rx = GrpcReceiver(host="127.0.0.1", port=0, tokens=Tokens(), max_request_bytes=1 << 20, max_concurrent_rpcs=8,
                           admission=admission, next_consumer=batcher)
    app = OtlpHttpApp(tokens=Tokens(), bound_host="127.0.0.1", max_request_bytes=1 << 20, next_consumer=batcher,
                      store=store, admission=admission.with_request_cap(8), sql=sql, health=lambda: {"status": "ok"})
    http_rx = HttpReceiver(host="127.0.0.1", port=0, app=app, graceful_timeout_s=5)
    grpc_rx.start()
    http_rx.start()
    try:
        body = make_request(50)[0].SerializeToString()
        with grpc.insecure_channel(f"127.0.0.1:{grpc_rx.port}") as channel:
            call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                       request_serializer=None,
                                       response_deserializer=ExportTraceServiceResponse.FromString)
            with pytest.raises(grpc.RpcError) as err:
                call(body, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "write queue full" in err.value.details()
        retry = RetryInfo.FromString(dict(err.value.trailing_metadata())["google.rpc.retryinfo-bin"])
        assert retry.retry_delay.seconds == 7
        req = urllib.request.Request(f"http://127.0.0.1:{http_rx.port}/v1/traces", data=body,
                                     headers={"content-type": "application/x-protobuf"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as herr:
            urllib.request.urlopen(req, timeout=10)
        assert herr.value.code == 503 and herr.value.headers["retry-after"] == "7"
        assert "write queue full" in status_pb2.Status.FromString(herr.value.read()).message
    finally:
        consumer.gate.set()
        assert blocker.result(10) == 50
        grpc_rx.shutdown(5)
        http_rx.shutdown(5)
        batcher.shutdown(5)
        sql.shutdown()
        store.close()

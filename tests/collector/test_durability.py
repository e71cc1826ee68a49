"""No acknowledged span is lost: SIGKILL mid-stream, concurrent exporters, SIGTERM flush."""

from __future__ import annotations

import threading
import time

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spanrl import semconv as sc


def _spans(n: int, rollout_id: str) -> list[ReadableSpan]:
    """``n`` finished SDK spans (with realistic attributes) to hand to exporters."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({sc.SERVICE_NAME: "agent", sc.ROLLOUT_ID: rollout_id}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.durability")
    for i in range(n):
        with tracer.start_as_current_span("chat tiny", attributes={sc.GEN_AI_OPERATION_NAME: "chat",
                                                                   sc.GEN_AI_INPUT_MESSAGES: "m" * 200, "i": i}):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def _ids(spans: list[ReadableSpan]) -> set[str]:
    return {format(s.context.span_id, "016x") for s in spans}


def test_sigkill_loses_no_acknowledged_span(collector_proc):
    spans = _spans(3000, "killed")
    batches = [spans[i : i + 100] for i in range(0, len(spans), 100)]
    exporter = GrpcExporter(endpoint=collector_proc.grpc_endpoint, insecure=True, timeout=3)
    acked: set[str] = set()
    failed_after_kill = threading.Event()
    killed = threading.Event()

    def stream() -> None:  # cycles through the batches until an export fails after the kill
        while True:
            for batch in batches:
                if exporter.export(batch) is SpanExportResult.SUCCESS:
                    acked.update(_ids(batch))
                elif killed.is_set():
                    failed_after_kill.set()
                    return

    sender = threading.Thread(target=stream, daemon=True)
    sender.start()
    deadline = time.monotonic() + 60
    while len(acked) < 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    collector_proc.kill()  # SIGKILL while the exporter is mid-stream
    killed.set()
    sender.join(60)
    exporter.shutdown()
    assert failed_after_kill.is_set(), "the exporter never noticed the kill"
    assert len(acked) >= 1000

    collector_proc.start()  # same file, DuckDB replays its WAL
    stored = {r["span_id"]
              for r in collector_proc.sql("SELECT DISTINCT span_id FROM spans WHERE rollout_id = 'killed'")}
    assert acked <= stored, f"{len(acked - stored)} acknowledged spans lost"


def test_sixteen_concurrent_exporters_all_spans_in(collector):
    jobs = []
    for k in range(16):
        spans = _spans(300, f"conc-{k}")
        exporter = (
            GrpcExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=60)
            if k % 2 == 0
            else HttpExporter(endpoint=f"{collector.http_endpoint}/v1/traces", timeout=60)
        )
        jobs.append((exporter, [spans[i : i + 50] for i in range(0, len(spans), 50)]))
    results: list[SpanExportResult] = []

    def run(exporter, batches) -> None:
        for batch in batches:
            results.append(exporter.export(batch))
        exporter.shutdown()

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results.count(SpanExportResult.SUCCESS) == 16 * 6
    counts = collector.store.sql(
        "SELECT rollout_id, count(DISTINCT span_id) AS n FROM spans GROUP BY ALL ORDER BY ALL"
    ).to_pylist()
    assert counts == [{"rollout_id": f"conc-{k}", "n": 300} for k in sorted(range(16), key=lambda k: f"conc-{k}")]


def test_sigterm_flushes_and_exits_zero(collector_proc):
    """SIGTERM while exports are in flight: the collector exits 0 and every export it acknowledged,
    including those it was still handling when the signal came, is in the store. Sent when nothing was
    in flight (as this test did before), it could not tell a flush from none: the in-flight assertion
    below fails then. Bodies are encoded up front so that the collector's side of each export, not the
    client's encoding, is where the time goes. With the gRPC receiver's stop(grace) set to None (in-flight
    RPCs aborted, not finished) it fails: no export was acknowledged after the signal."""
    import grpc
    from _otlp import make_request

    spans = _spans(500, "term")
    exporter = GrpcExporter(endpoint=collector_proc.grpc_endpoint, insecure=True, timeout=30)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    bodies = {f"term-{k}": make_request(2000, rollout_id=f"term-{k}")[0].SerializeToString() for k in range(40)}
    pending, lock = list(bodies), threading.Lock()
    done: list[tuple[str, float, float, bool]] = []

    def send() -> None:
        with grpc.insecure_channel(collector_proc.grpc_endpoint) as channel:
            call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                       request_serializer=None, response_deserializer=None)
            while True:
                with lock:
                    if not pending:
                        return
                    rid = pending.pop(0)
                started = time.monotonic()
                try:
                    call(bodies[rid], timeout=30)
                    ok = True
                except grpc.RpcError:  # refused (shutting down) or no server: not acknowledged
                    ok = False
                done.append((rid, started, time.monotonic(), ok))

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    while len(done) < 6:  # traffic is flowing
        time.sleep(0.005)
    signalled = time.monotonic()
    assert collector_proc.terminate() == 0
    for t in threads:
        t.join(60)
    from spanrl.store import SpanStore

    acked = [rid for rid, _, _, ok in done if ok]
    # acknowledged after the signal: the server had taken them before it stopped taking new RPCs
    in_flight = [rid for rid, started, ended, ok in done if ok and started < signalled < ended]
    assert in_flight, [(rid, round(e - signalled, 3), ok) for rid, _, e, ok in done]
    with SpanStore.open(collector_proc.db_path, read_only=True) as store:
        assert store.span_count("term") == 500
        assert {rid: store.span_count(rid) for rid in acked} == {rid: 2000 for rid in acked}

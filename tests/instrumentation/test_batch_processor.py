"""BatchEncodingSpanProcessor: spans leave as valid OTLP requests (checked by a gRPC receiver built from
the official generated service, as a stock OpenTelemetry Collector's, and by a real `spanrl collector`),
in batches under the size caps, and the queue behaves as the SDK's BatchSpanProcessor's does."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from spanrl.errors import ConfigError
from spanrl.instrumentation.batch import BatchEncodingSpanProcessor, export_span_processor
from spanrl.instrumentation.exporter import FastOTLPSpanExporter, snapshot

BIN = Path(sys.executable).parent


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver from the official generated code: it parses what it gets."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.sizes: list[int] = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 - the generated service's name
        with self.lock:
            self.requests.append(request)
            self.sizes.append(request.ByteSize())
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list:
        with self.lock:
            return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    servicer = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"http://127.0.0.1:{port}"
    server.stop(None)


def _provider(processor, **kwargs) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "batch-test", "spanrl.rollout.id": "r-b"}),
                              **kwargs)
    provider.add_span_processor(processor)
    return provider


def _chat_like(tracer, i: int, content: str = "") -> None:
    with tracer.start_as_current_span("openai.chat") as span:
        span.set_attributes({
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny", "gen_ai.is_streaming": False,
            "gen_ai.response.id": f"chatcmpl-{i}", "gen_ai.response.finish_reasons": ("stop",),
            "gen_ai.usage.input_tokens": 9 + i,
            "gen_ai.input.messages": f'[{{"role": "user", "content": "{content}{i}"}}]',
        })
        span.add_event("seen", {"n": i})


def _response_ids(servicer: Receiver) -> list[str]:
    return sorted(a.value.string_value for s in servicer.spans() for a in s.attributes if a.key == "gen_ai.response.id")


def _wait(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_requests_equal_the_sdk_encoding_of_the_same_spans(receiver):
    servicer, endpoint = receiver
    memory = InMemorySpanExporter()
    processor = BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint=endpoint, insecure=True),
                                           schedule_delay_millis=60_000)
    provider = _provider(processor)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracers = [provider.get_tracer("scope.a", "1.0"), provider.get_tracer("scope.b", schema_url="https://s/1")]
    for i in range(20):
        _chat_like(tracers[i % 2], i)
    assert processor.force_flush()
    assert len(servicer.requests) == 1  # one request for the whole batch, grouped by scope
    expected = encode_spans(memory.get_finished_spans())
    assert servicer.requests[0] == expected
    provider.shutdown()


def test_batches_stay_under_the_span_and_byte_caps(receiver):
    servicer, endpoint = receiver
    processor = BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint=endpoint, insecure=True), max_queue_size=1000,
                                           schedule_delay_millis=60_000, max_export_batch_size=40,
                                           max_export_batch_bytes=8000)
    provider = _provider(processor)
    tracer = provider.get_tracer("t")
    for i in range(100):
        _chat_like(tracer, i, content="x" * 300)
    assert processor.force_flush()
    assert _response_ids(servicer) == sorted(f"chatcmpl-{i}" for i in range(100))  # every span once
    assert all(size <= 8000 + 200 for size in servicer.sizes)  # the cap counts spans; headers are small
    assert len(servicer.requests) >= 100 * 400 // 8000  # the byte cap split the 40-span batches
    provider.shutdown()


def test_a_full_batch_wakes_the_export_thread(receiver):
    servicer, endpoint = receiver
    processor = BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint=endpoint, insecure=True),
                                           schedule_delay_millis=600_000, max_export_batch_size=5)
    provider = _provider(processor)
    for i in range(5):
        _chat_like(provider.get_tracer("t"), i)
    assert _wait(lambda: len(servicer.spans()) == 5)  # no flush, no delay: the batch size did it
    provider.shutdown()


def test_a_full_batch_sends_full_batches_only(receiver):
    servicer, endpoint = receiver
    processor = BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint=endpoint, insecure=True),
                                           schedule_delay_millis=600_000, max_export_batch_size=100)
    provider = _provider(processor)
    for i in range(150):
        _chat_like(provider.get_tracer("t"), i)
    assert _wait(lambda: len(servicer.spans()) >= 100)
    time.sleep(0.5)  # the 50 left wait for the delay or a flush: no request per partial batch
    assert [len(r.resource_spans[0].scope_spans[0].spans) for r in servicer.requests] == [100]
    assert processor.force_flush()
    assert len(servicer.spans()) == 150 and len(servicer.requests) == 2
    provider.shutdown()


def test_full_queue_drops_new_spans_and_counts_them(receiver):
    servicer, endpoint = receiver
    processor = BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint=endpoint, insecure=True),
                                           max_queue_size=4, schedule_delay_millis=600_000, max_export_batch_size=4)
    provider = _provider(processor)
    with processor._export_lock:  # hold the export thread, as a stalled collector would
        for i in range(10):
            _chat_like(provider.get_tracer("t"), i)
        assert processor.dropped == 6
    assert processor.force_flush()
    assert _response_ids(servicer) == [f"chatcmpl-{i}" for i in range(4)]
    provider.shutdown()


def test_unsampled_spans_are_not_queued_and_shutdown_flushes(receiver):
    servicer, endpoint = receiver
    processor = BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint=endpoint, insecure=True),
                                           schedule_delay_millis=600_000)
    off = _provider(processor, sampler=ALWAYS_OFF)
    _chat_like(off.get_tracer("t"), 0)
    assert len(processor._queue) == 0
    on = TracerProvider()
    on.add_span_processor(processor)
    _chat_like(on.get_tracer("t"), 1)
    processor.shutdown()  # exports what is queued, then refuses more
    assert [s.name for s in servicer.spans()] == ["openai.chat"]
    assert processor.force_flush() is False


def test_bad_settings_raise_config_error(receiver):
    _, endpoint = receiver
    exporter = FastOTLPSpanExporter(endpoint=endpoint, insecure=True)
    with pytest.raises(ConfigError, match="max_export_batch_size must be <= max_queue_size, got 10 > 5"):
        BatchEncodingSpanProcessor(exporter, max_queue_size=5, max_export_batch_size=10)
    with pytest.raises(ConfigError, match="schedule_delay_millis must be positive, got 0"):
        BatchEncodingSpanProcessor(exporter, schedule_delay_millis=0)


def test_environment_settings_apply(receiver, monkeypatch):
    _, endpoint = receiver
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "77")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "7")
    processor = BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint=endpoint, insecure=True))
    assert (processor._max_queue_size, processor._max_batch) == (77, 7)
    processor.shutdown()


def test_other_exporters_get_the_sdk_batch_processor(receiver):
    _, endpoint = receiver
    ours = export_span_processor(FastOTLPSpanExporter(endpoint=endpoint, insecure=True))
    theirs = export_span_processor(InMemorySpanExporter())
    assert isinstance(ours, BatchEncodingSpanProcessor) and type(theirs) is BatchSpanProcessor
    ours.shutdown()
    theirs.shutdown()


def test_snapshot_holds_nothing_the_garbage_collector_must_follow():
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("root"):
        with provider.get_tracer("t").start_as_current_span("child",
                                                            attributes={"a": "x", "n": 1, "f": 0.5, "b": True}):
            pass
    for span in memory.get_finished_spans():
        snap = snapshot(span)
        assert [type(x).__name__ for x in snap if gc.is_tracked(x)] == []  # no span, context, dict or status kept
        gc.collect()
        assert not gc.is_tracked(snap)  # so it is never promoted to the old generation


def test_spanrl_configurator_installs_it_under_opentelemetry_instrument(collector_proc):
    code = ("from opentelemetry import trace; p = trace.get_tracer_provider();"
            "print(sorted(type(s).__name__ for s in p._active_span_processor._span_processors))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPANRL_"))}
    env.update(OTEL_PYTHON_DISTRO="spanrl", OTEL_PYTHON_CONFIGURATOR="spanrl",
               OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{collector_proc.grpc_endpoint}")
    out = subprocess.run([str(BIN / "opentelemetry-instrument"), str(BIN / "python"), "-c", code], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "BatchEncodingSpanProcessor" in out.stdout and "BatchSpanProcessor'" not in out.stdout, out.stdout

"""The fast OTLP encoder: decoded, its request equals the SDK encoder's, field for field."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState, set_span_in_context

from spanrl.instrumentation.exporter import FastOTLPSpanExporter, encode_request


def _varied_spans():
    exporter = InMemorySpanExporter()
    spans = []
    for resource in (Resource.create({"service.name": "a", "spanrl.rollout.id": "r-1", "n": 3}),
                     Resource({"service.name": "b"}, schema_url="https://schema/1")):
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("scope.a", "1.2", schema_url="https://schema/scope", attributes={"k": "v"})
        other = provider.get_tracer("scope.b")
        with tracer.start_as_current_span("root", kind=SpanKind.SERVER) as root:
            root.set_attributes({
                "s": "héllo ✓", "empty": "", "b": True, "f": False, "i": 0, "neg": -42, "big": 2**62,
                "d": 0.0, "pi": 3.14159, "ids": [1, 2, 300, 70000], "lp": [-0.5, 0.0], "names": ["a", ""],
                "flags": [True, False], "long": "x" * 5000,
            })
            root.add_event("evt", {"spanrl.observation.content": "seen", "n": 1})
            root.add_event("bare")
            root.set_status(Status(StatusCode.ERROR, "boom"))
            with other.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
                child.set_status(Status(StatusCode.OK))
        remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v"), ("x", "y")]))
        with tracer.start_as_current_span("remote child", context=set_span_in_context(NonRecordingSpan(remote)),
                                          links=[Link(remote, {"why": "batch"}), Link(SpanContext(1, 2, is_remote=False))]):
            pass
        with tracer.start_as_current_span("", kind=SpanKind.PRODUCER):
            pass
    spans = list(exporter.get_finished_spans())
    assert len(spans) == 8
    return spans


def test_encoding_equals_the_sdk_encoder():
    spans = _varied_spans()
    fast = ExportTraceServiceRequest.FromString(encode_request(spans))
    assert fast == encode_spans(spans)
    assert len(fast.resource_spans) == 2
    assert encode_request(spans) == encode_request(spans)  # caches give the same bytes


def test_each_span_alone_equals_the_sdk_encoder():
    for span in _varied_spans():
        assert ExportTraceServiceRequest.FromString(encode_request([span])) == encode_spans([span])


def test_unencodable_attribute_is_skipped_like_the_sdk():
    span = _varied_spans()[0]
    span._attributes = dict(span.attributes, huge=2**64, odd=object())  # noqa: SLF001 - a hand-made bad span
    assert ExportTraceServiceRequest.FromString(encode_request([span])) == encode_spans([span])


def test_empty_batch():
    assert encode_request([]) == b""


@pytest.mark.parametrize("insecure", [True])
def test_exporter_sends_to_a_real_collector(collector_proc, insecure):
    spans = _varied_spans()
    exporter = FastOTLPSpanExporter(endpoint=f"http://{collector_proc.grpc_endpoint}", insecure=insecure)
    assert exporter.export(spans).name == "SUCCESS"
    exporter.shutdown()
    rows = collector_proc.sql("SELECT name, service_name, rollout_id, status_code, attributes FROM spans ORDER BY name")
    assert sorted(r["name"] for r in rows) == sorted(s.name for s in spans)
    root = next(r for r in rows if r["name"] == "root" and r["service_name"] == "a")
    assert root["rollout_id"] == "r-1" and root["status_code"] == "ERROR"


def test_exporter_reconnects_after_the_collector_restarts(collector_proc):
    spans = _varied_spans()
    exporter = FastOTLPSpanExporter(endpoint=f"http://{collector_proc.grpc_endpoint}", insecure=True, timeout=2)
    assert exporter.export(spans[:2]).name == "SUCCESS"
    collector_proc.kill()
    assert exporter.export(spans[2:4]).name == "FAILURE"  # UNAVAILABLE: the channel is rebuilt with our stub
    collector_proc.start()
    assert exporter.export(spans[4:]).name == "SUCCESS"
    exporter.shutdown()
    names = sorted(r["name"] for r in collector_proc.sql("SELECT name FROM spans"))
    assert names == sorted(s.name for s in spans[:2] + spans[4:])

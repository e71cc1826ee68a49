"""The fast OTLP encoder: decoded, its request equals the SDK encoder's, field for field, with the C encoder
(instrumentation/_encode.c) and without it; where the C encoder takes a span, its bytes equal the Python
encoder's, byte for byte."""

from __future__ import annotations

import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags,
                                 TraceState, set_span_in_context)

from required import missing

from spanrl.instrumentation import exporter as fast
from spanrl.instrumentation.exporter import FastOTLPSpanExporter, encode_request, snapshot


@pytest.fixture(autouse=True)
def _each_encoder(encoder: str) -> None:
    """Every test here with the C encoder and with the Python one (tests/instrumentation/conftest.py)."""


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
        remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                             trace_state=TraceState([("k", "v"), ("x", "y")]))
        with tracer.start_as_current_span("remote child", context=set_span_in_context(NonRecordingSpan(remote)),
                                          links=[Link(remote, {"why": "batch"}),
                                                 Link(SpanContext(1, 2, is_remote=False))]):
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


def _limited_spans():
    """Spans over the SDK's limits (dropped attributes, events, links), and one value of many types per key."""
    exporter = InMemorySpanExporter()
    limits = SpanLimits(max_span_attributes=4, max_events=2, max_links=1, max_event_attributes=1, max_link_attributes=1)
    provider = TracerProvider(resource=Resource.create({"service.name": "limits"}), span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("limits", schema_url="https://schema/2")
    other = SpanContext(7, 8, is_remote=False)
    values = [1, True, 1.0, "1", (1,), (True,), (1.0,), ("1",), -0.0, 0.0, float("inf"), -(2**63), 2**63 - 1, -1,
              "ü" * 200, "ü" * 20, (), ("a", "b"), 127, 128, 16384]
    for i, value in enumerate(values):  # the same key with values that are equal as dict keys (1 == True == 1.0)
        with tracer.start_as_current_span(f"v{i}", links=[Link(other, {"a": 1, "b": 2}), Link(other)]) as span:
            span.set_attribute("x", value)
            for j in range(5):
                span.set_attribute(f"k{j}", j)
            for j in range(3):
                span.add_event(f"e{j}", {"a": j, "b": "two"})
            span.set_status(Status(StatusCode.OK, None) if i % 2 else Status(StatusCode.ERROR, f"bad {i}"))
    spans = list(exporter.get_finished_spans())
    assert spans[0].dropped_attributes and spans[0].dropped_events and spans[0].dropped_links
    return spans


def test_limits_and_colliding_values_equal_the_sdk_encoder():
    spans = _limited_spans()
    for span in spans:
        assert ExportTraceServiceRequest.FromString(encode_request([span])) == encode_spans([span]), span.name
    assert ExportTraceServiceRequest.FromString(encode_request(spans)) == encode_spans(spans)


def test_caches_that_fill_up_start_over(monkeypatch):
    monkeypatch.setattr(fast, "_CACHE_MAX_ENTRIES", 3)
    monkeypatch.setattr(fast, "_field_caches", {})
    monkeypatch.setattr(fast, "_group_cache", {})
    spans = _limited_spans() + _varied_spans()
    for _ in range(2):  # the second pass reads what the first cached
        assert ExportTraceServiceRequest.FromString(encode_request(spans)) == encode_spans(spans)
    assert all(len(cache) <= 3 for caches in fast._field_caches.values() for cache in caches.values())
    assert len(fast._group_cache) <= 3


class _OwnSpan(ReadableSpan):
    """A ReadableSpan subclass: the encoder reads it through the public properties."""

    @property
    def name(self) -> str:
        return "renamed " + self._name


def test_span_subclasses_are_read_through_their_properties():
    for span in _varied_spans()[:3]:
        own = _OwnSpan(name=span.name, context=span.context, parent=span.parent, resource=span.resource,
                       attributes=span.attributes, events=span.events, links=span.links, kind=span.kind,
                       status=span.status, start_time=span.start_time, end_time=span.end_time,
                       instrumentation_scope=span.instrumentation_scope)
        decoded = ExportTraceServiceRequest.FromString(encode_request([own]))
        assert decoded == encode_spans([own])
        assert decoded.resource_spans[0].scope_spans[0].spans[0].name.startswith("renamed ")


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


# --- the C encoder against the Python reference ---------------------------------------------------------


only_c = pytest.mark.parametrize("encoder", ["c"], indirect=True)  # these compare the C encoder with Python


def _c(encoder: str):
    assert encoder == "c"
    return fast._encode


_TEXT = ["", "a", "héllo ✓", "😀 emoji", "x" * 127, "y" * 128, "z" * 20000, "ü" * 70, "tab\tnew\nline", "\x00nul"]


def _random_value(rng: random.Random):
    kind = rng.randrange(9)
    if kind == 0:
        return rng.choice(_TEXT)
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, 1, 127, 128, 16383, 16384, -1, -(2**63), 2**63 - 1, rng.randrange(-(2**40), 2**40)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.5, -2.25e300, math.inf, -math.inf, math.nan, rng.random()])
    if kind == 4:
        return tuple(rng.choice(_TEXT) for _ in range(rng.randrange(4)))
    if kind == 5:
        return [rng.randrange(-300, 300) for _ in range(rng.randrange(5))]
    if kind == 6:
        return tuple(rng.random() for _ in range(rng.randrange(3)))
    if kind == 7:
        return [rng.random() < 0.5 for _ in range(rng.randrange(3))]
    return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(200)))


def _random_spans(seed: int, count: int) -> list[ReadableSpan]:
    rng = random.Random(seed)
    memory = InMemorySpanExporter()
    limits = SpanLimits(max_span_attributes=rng.choice([8, 128]))
    provider = TracerProvider(resource=Resource.create({"service.name": f"r{seed}", "n": seed}), span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracers = [provider.get_tracer("a", "1.0"), provider.get_tracer("b", schema_url="https://s/1")]
    for i in range(count):
        tracer = rng.choice(tracers)
        parent = None
        if rng.random() < 0.3:
            remote = SpanContext(rng.getrandbits(128) or 1, rng.getrandbits(64) or 1, is_remote=rng.random() < 0.5,
                                 trace_flags=TraceFlags(1), trace_state=TraceState(rng.choice([[], [("k", "v")]])))
            parent = set_span_in_context(NonRecordingSpan(remote))
        name = rng.choice(["chat tiny", "", "execute_tool add", "ünï " * rng.randrange(3)])
        with tracer.start_as_current_span(name, context=parent, kind=SpanKind(rng.randrange(5))) as span:
            for j in range(rng.randrange(20)):
                span.set_attribute(rng.choice(["k", f"key.{j}", "gen_ai.input.messages", "ключ", ""]) + str(j % 3),
                                   _random_value(rng))
            code = rng.choice([StatusCode.UNSET, StatusCode.OK, StatusCode.ERROR])
            span.set_status(Status(code, rng.choice([None, "", "bad ✗"]) if code is StatusCode.ERROR else None))
            if rng.random() < 0.2:
                with tracer.start_as_current_span(f"child {i}"):
                    pass
    return list(memory.get_finished_spans())


def _reference(span: ReadableSpan) -> bytes:
    """The Python encoder's span field."""
    return fast._encode_snapshot(snapshot(span))[2]


def _with_plain_attributes(span: ReadableSpan, rng: random.Random) -> ReadableSpan:
    """The span again with a plain dict of attributes, as hand-made spans have: sequences stay lists (the
    SDK's own attributes make them tuples), empty ones included."""
    attributes = {k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()}
    attributes.update({"empty": [], "texts": ["ü", "", "a" * 300], "mixed": [1, "b", 2.5, True]}
                      if rng.random() < 0.5 else {"also empty": ()})
    return ReadableSpan(name=span.name, context=span.context, parent=span.parent, resource=span.resource,
                        attributes=attributes, kind=span.kind, status=span.status, start_time=span.start_time,
                        end_time=span.end_time, instrumentation_scope=span.instrumentation_scope)


@only_c
@pytest.mark.parametrize("seed", range(4))
def test_c_encoder_equals_the_python_encoder_byte_for_byte(encoder, seed):
    c = _c(encoder)
    rng = random.Random(seed)
    spans = _random_spans(seed, 300)
    spans += [_with_plain_attributes(span, rng) for span in spans[:100]]
    for span in spans:
        assert c.encode_snapshot(snapshot(span)) == _reference(span), (span.name, dict(span.attributes))
    assert len(spans) > 400
    assert ExportTraceServiceRequest.FromString(encode_request(spans)) == encode_spans(spans)


@only_c
def test_c_encoder_declines_what_it_does_not_take(encoder):
    c = _c(encoder)
    spans = {s.name: s for s in _varied_spans()}
    assert c.encode_snapshot(snapshot(spans["root"])) is None  # events
    assert c.encode_snapshot(snapshot(spans["remote child"])) is None  # links
    for name in ("child", ""):  # the common shape: taken, and equal to the Python encoder's bytes
        assert c.encode_snapshot(snapshot(spans[name])) == _reference(spans[name])
    child = spans["child"]
    odd = [{"huge": 2**64}, {"surrogate": "\ud800"}, {"none": (None,)}, {"nested": ((1,),)}, {"odd": object()},
           {"sub": type("Text", (str,), {})("x")}, {1: "key not a str"}]
    for attributes in odd:
        child._attributes = attributes  # noqa: SLF001 - a hand-made odd span
        assert c.encode_snapshot(snapshot(child)) is None, attributes
        if "surrogate" in attributes or 1 in attributes:  # the Python encoder raises: the processor logs, drops
            with pytest.raises((UnicodeEncodeError, AttributeError)):
                encode_request([child])
        else:  # and takes the rest, skipping what the SDK encoder skips
            assert ExportTraceServiceRequest.FromString(encode_request([child])) == encode_spans([child])
    for bad in (("not", "a", "snapshot"), snapshot(child)[:-1], [*snapshot(child)]):
        assert c.encode_snapshot(bad) is None
    child._attributes = {"a": 1}
    snap = snapshot(child)
    for at, value in ((8, 2**32 + 1), (8, 5), (13, 2**32), (13, -1), (6, 1)):  # kind, status code, remote
        odd_snap = snap[:at] + (value,) + snap[at + 1:]
        assert c.encode_snapshot(odd_snap) is None, (at, value)


@only_c
def test_c_encoder_is_clean_under_the_sanitizers(encoder):
    """bench/encode_sanitized.py: the C encoder built with ASan + UBSan, byte for byte against Python."""
    _c(encoder)
    if shutil.which("gcc") is None:
        missing("gcc is not installed (it builds the C extensions)")
    for runtime in ("libasan.so", "libubsan.so"):  # a bare name back: not installed with this gcc
        found = subprocess.run(["gcc", f"-print-file-name={runtime}"], capture_output=True, text=True).stdout.strip()
        if not Path(found).is_absolute():
            missing(f"gcc's {runtime} is not installed (Debian: libgcc-12-dev)")
    bench = Path(__file__).resolve().parents[2] / "bench" / "encode_sanitized.py"
    out = subprocess.run([sys.executable, str(bench), "--seeds", "5"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "byte for byte equal to the Python encoder under ASan + UBSan" in out.stdout


@only_c
def test_c_encoder_leaves_no_utf8_copy_in_the_agents_strings(encoder):
    """A non-ASCII str is converted for the write, not given a UTF-8 copy that lives as long as it does
    (``sys.getsizeof`` counts such a copy)."""
    c = _c(encoder)
    child = {s.name: s for s in _varied_spans()}["child"]
    text = "".join(["ünï ✓ ", str(random.random())]) * 50  # made here: no UTF-8 cached yet
    child._attributes = {"message ✓": text, "texts": (text, "ok")}
    size = sys.getsizeof(text)
    assert c.encode_snapshot(snapshot(child)) == _reference(child)
    assert sys.getsizeof(text) == size

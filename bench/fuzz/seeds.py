"""Seed inputs for the decoder fuzzer and the differential test: OTLP ExportTraceServiceRequest bodies.

    seed_bodies(n_random)  -> [(name, body)]
    write_seeds(directory, n_random) -> how many files (named by content hash) were written

From: the project's fuzz corpus (`tests/collector/corpus/*.bin`: inputs found by fuzzing, each a test
too), the fast-path test generator (`tests/collector/test_fast_decode.py::_random_request`: every value
kind, nested arrays, the three token encodings, events, links, status, several resource / scope spans),
the bench workloads (`bench/ingest.py`), the fault suite's requests and malformed bodies
(`bench/faults.py`), the OTel SDK's encoder and spanrl's exporter, and shapes at the decoder's edges:
arrays nested 15-17 deep, lists past the duplicate-key scan (hash set) with and without a duplicate,
powers of two as doubles, token arrays in each encoding, attributes without a key.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "collector" / "corpus"

__all__ = ["CORPUS", "seed_bodies", "write_seeds"]


def _load(path: Path, name: str) -> ModuleType:
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # the test module imports its neighbour `_otlp`
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # bench/ and tests/ hold scripts, not packages
    return module


def corpus_bodies() -> list[tuple[str, bytes]]:
    """The project's own corpus: bodies found by fuzzing (tests/collector/corpus)."""
    return [(p.name, p.read_bytes()) for p in sorted(CORPUS.glob("*.bin"))]


def _edge_bodies() -> list[tuple[str, bytes]]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1 import common_pb2

    def one() -> tuple[ExportTraceServiceRequest, object]:
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.add(key="service.name").value.string_value = "agent"
        span = rs.scope_spans.add().spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s")
        return req, span

    out = []
    for depth in (15, 16, 17):
        req, span = one()
        value = span.attributes.add(key="nested").value
        for _ in range(depth):
            value = value.array_value.values.add()
        value.int_value = 1
        out.append((f"nested-{depth}", req.SerializeToString()))
    for n, dup in ((15, False), (17, False), (40, False), (40, True), (300, True)):
        req, span = one()
        for i in range(n):
            span.attributes.add(key=f"k{i}").value.bool_value = True
        if dup:
            span.attributes.add(key=f"k{n // 2}").value.int_value = 2
        out.append((f"keys-{n}{'-dup' if dup else ''}", req.SerializeToString()))
    req, span = one()
    for k in range(-1074, 1024, 97):
        span.attributes.add(key=f"d{k}").value.double_value = 2.0**k
    out.append(("doubles", req.SerializeToString()))
    req, span = one()
    ids = common_pb2.AnyValue(
        array_value=common_pb2.ArrayValue(values=[common_pb2.AnyValue(int_value=i) for i in (0, 1, 50256, -5)])
    )
    span.attributes.add(key="spanrl.llm.prompt_token_ids", value=ids)
    span.attributes.add(key="spanrl.llm.completion_token_ids").value.string_value = "AQAAAAIAAAA="
    span.attributes.add(key="spanrl.llm.logprobs").value.bytes_value = b"\x00\x00\x80\xbf"
    span.attributes.add(key="spanrl.reward.value").value.double_value = 0.5
    out.append(("tokens", req.SerializeToString()))
    req, span = one()
    span.attributes.add()
    span.attributes.add(key="k")
    out.append(("no-key", req.SerializeToString()))
    return out


def _sdk_bodies() -> list[tuple[str, bytes]]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from spanrl.instrumentation.exporter import encode_request as spanrl_encode

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "agent", "spanrl.rollout.id": "r1"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("seeds", "0.1")
    with tracer.start_as_current_span("invoke_agent") as root:
        root.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.request.temperature": 0.7,
                             "spanrl.llm.prompt_token_ids": [1, 2, 3],
                             "spanrl.llm.logprobs": [-0.1, -2.0], "flags": [True, False]})
        root.add_event("gen_ai.choice", {"index": 0})
    spans = memory.get_finished_spans()
    provider.shutdown()
    return [("sdk-encoder", encode_spans(spans).SerializeToString()), ("spanrl-exporter", bytes(spanrl_encode(spans)))]


def seed_bodies(n_random: int = 200) -> list[tuple[str, bytes]]:
    """Every seed, as (name, body)."""
    fast = _load(REPO / "tests" / "collector" / "test_fast_decode.py", "_seed_test_fast_decode")
    ingest = _load(REPO / "bench" / "ingest.py", "_seed_bench_ingest")
    faults = _load(REPO / "bench" / "faults.py", "_seed_bench_faults")
    rng = random.Random(20261201)
    out = corpus_bodies() + _edge_bodies() + _sdk_bodies()
    out += [(f"random-{i}", fast._random_request(rng).SerializeToString()) for i in range(n_random)]
    out += [(f"workload-{w}", ingest.encode_otlp(ingest.make_spans(w, 2)[:3], "r1")) for w in ingest.WORKLOADS]
    out += [("faults-request", faults._request(3)[0].SerializeToString())]
    out += [(f"faults-{kind}-{i}", body) for i, (kind, body) in enumerate(faults._malformed_protobuf(rng, 60))
            if len(body) < 16384]
    return out


def write_seeds(directory: Path, n_random: int = 200) -> int:
    """Write `seed_bodies` into ``directory`` (one file each, named by its hash); returns the count."""
    directory.mkdir(parents=True, exist_ok=True)
    bodies = seed_bodies(n_random)
    for _, body in bodies:
        (directory / hashlib.sha1(body).hexdigest()).write_bytes(body)
    return len(bodies)


if __name__ == "__main__":  # pragma: no cover
    print(write_seeds(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "bench" / "fuzz" / "build" / "seeds"))

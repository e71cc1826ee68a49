"""Malformed input, oversized messages and wrong tokens get the documented error and store nothing."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from spanrl.collector import Collector, CollectorConfig
from _otlp import make_request

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_TOKEN = "s3cret"
_LIMIT_BYTES = 256 * 1024


@pytest.fixture
def guarded(tmp_path):
    """A collector with a token and a small request limit."""
    config = CollectorConfig(db_path=str(tmp_path / "g.duckdb"), grpc_port=0, http_port=0, token=_TOKEN,
                             max_request_bytes=_LIMIT_BYTES)
    with Collector(config) as c:
        yield c


def _grpc_export(collector, body: bytes, token: str | None = _TOKEN) -> ExportTraceServiceResponse:
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        call = channel.unary_unary(_EXPORT, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        metadata = [("authorization", f"Bearer {token}")] if token else None
        return call(body, metadata=metadata, timeout=30)


def _http_post(collector, body: bytes, ctype: str, token: str | None = _TOKEN, headers: dict | None = None):
    h = {"content-type": ctype, **(headers or {})}
    if token:
        h["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"{collector.http_endpoint}/v1/traces", data=body, headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_grpc_malformed_protobuf_is_invalid_argument(guarded):
    with pytest.raises(grpc.RpcError) as err:
        _grpc_export(guarded, b"\x0a\xff\xff\xff\xff\x0f garbage")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed OTLP protobuf" in err.value.details()
    assert guarded.store.span_count() == 0


def test_grpc_oversized_message_is_resource_exhausted(guarded):
    req, _ = make_request(10, attributes={"blob": "x" * _LIMIT_BYTES})
    with pytest.raises(grpc.RpcError) as err:
        _grpc_export(guarded, req.SerializeToString())
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert guarded.store.span_count() == 0


@pytest.mark.parametrize("token", [None, "wrong"])
def test_grpc_wrong_token_is_unauthenticated(guarded, token):
    req, _ = make_request(3)
    with pytest.raises(grpc.RpcError) as err:
        _grpc_export(guarded, req.SerializeToString(), token=token)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert guarded.store.span_count() == 0
    _grpc_export(guarded, req.SerializeToString())  # the right token goes through
    assert guarded.store.span_count() == 3


def test_http_malformed_protobuf_is_400_with_status(guarded):
    status, _, body = _http_post(guarded, b"\x0a\xff\xff\xff\xff\x0f garbage", "application/x-protobuf")
    assert status == 400
    assert "malformed OTLP protobuf" in status_pb2.Status.FromString(body).message
    assert guarded.store.span_count() == 0


def test_http_malformed_json_is_400_with_message(guarded):
    status, _, body = _http_post(guarded, b'{"resourceSpans": [', "application/json")
    assert status == 400
    doc = json.loads(body)
    assert doc["code"] == 3 and "malformed OTLP/JSON" in doc["message"]
    status, _, body = _http_post(guarded,
                                 b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
                                 "application/json")
    assert status == 400 and "startTimeUnixNano" in json.loads(body)["message"]
    assert guarded.store.span_count() == 0


def test_http_oversized_body_is_413(guarded):
    req, _ = make_request(10, attributes={"blob": "x" * _LIMIT_BYTES})
    status, _, body = _http_post(guarded, req.SerializeToString(), "application/x-protobuf")
    assert status == 413 and "max_request_bytes" in status_pb2.Status.FromString(body).message
    # A gzip bomb: small on the wire, over the limit once inflated.
    status, _, _ = _http_post(guarded, gzip.compress(req.SerializeToString()), "application/x-protobuf",
                              headers={"content-encoding": "gzip"})
    assert status == 413
    assert guarded.store.span_count() == 0


def test_http_wrong_token_is_401(guarded):
    req, _ = make_request(3)
    status, headers, body = _http_post(guarded, req.SerializeToString(), "application/x-protobuf", token="nope")
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert "bearer token" in status_pb2.Status.FromString(body).message
    assert guarded.store.span_count() == 0


def test_http_unsupported_content_type_is_415(guarded):
    status, _, _ = _http_post(guarded, b"hello", "text/plain")
    assert status == 415


def test_http_gzip_protobuf_is_stored(guarded):
    req, ids = make_request(7)
    status, _, body = _http_post(guarded, gzip.compress(req.SerializeToString()), "application/x-protobuf",
                                 headers={"content-encoding": "gzip"})
    assert status == 200 and not ExportTraceServiceResponse.FromString(body).HasField("partial_success")
    got = {r["span_id"] for r in guarded.store.sql("SELECT span_id FROM spans").to_pylist()}
    assert got == set(ids)


def test_bad_spans_rejected_alone_with_partial_success(guarded):
    req, ids = make_request(5)
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[1].trace_id = b"\x01" * 5
    spans[3].attributes.add(key="spanrl.llm.prompt_token_ids").value.string_value = "not base64!"
    response = _grpc_export(guarded, req.SerializeToString())
    assert response.partial_success.rejected_spans == 2
    assert ("span 1" in response.partial_success.error_message
            and "trace_id must be 16 bytes" in response.partial_success.error_message)
    assert "spanrl.llm.prompt_token_ids" in response.partial_success.error_message
    got = {r["span_id"] for r in guarded.store.sql("SELECT span_id FROM spans").to_pylist()}
    assert got == {ids[0], ids[2], ids[4]}


def test_sdk_exporters_with_token_headers_and_gzip_are_accepted(guarded):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    header = {"authorization": f"Bearer {_TOKEN}"}
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(GrpcExporter(endpoint=guarded.grpc_endpoint, insecure=True,
                                                                 headers=header, compression=grpc.Compression.Gzip)))
    provider.add_span_processor(SimpleSpanProcessor(HttpExporter(endpoint=f"{guarded.http_endpoint}/v1/traces",
                                                                 headers=header, compression=Compression.Gzip)))
    with provider.get_tracer("t").start_as_current_span("authorized"):
        pass
    provider.shutdown()
    assert guarded.store.sql("SELECT count(*) AS n FROM spans WHERE name = 'authorized'").to_pylist() == [{"n": 2}]

"""Arrays kept as wire bytes at parse time: the same rows as a standard parse, and bad bytes still refused."""

from __future__ import annotations

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from _otlp import make_request
from spanrl import semconv as sc
from spanrl.collector import Collector, CollectorConfig
from spanrl.collector.encoding import decode_protobuf_request, encode_request
from spanrl.collector.errors import PermanentError

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _with_raw_array(raw: bytes, key: str = sc.LLM_PROMPT_TOKEN_IDS) -> bytes:
    """A serialized one-span request whose attribute ``key`` is an array_value holding exactly ``raw``.

    Built as bytes_value (field 7) of the same length, then retagged as array_value (field 5): no
    length around it changes, and no standard message class could be made to hold malformed bytes.
    """
    req, _ = make_request(1, attributes={key: raw})
    body = req.SerializeToString()
    old = b"\x3a" + bytes([len(raw)]) + raw
    assert len(raw) < 128 and body.count(old) == 1
    return body.replace(old, b"\x2a" + bytes([len(raw)]) + raw)


def _ints(*values: int) -> bytes:
    out = b""
    for v in values:
        out += bytes([0x0A, 2, 0x18, v])  # AnyValue{int_value: v}, v < 128
    return out


def test_parsed_and_standard_requests_give_the_same_rows():
    attributes = {
        sc.LLM_PROMPT_TOKEN_IDS: [0, 1, 300, 70000, 2**31 - 1, -5],
        sc.LLM_COMPLETION_TOKEN_IDS: [],
        sc.LLM_LOGPROBS: [-0.25, 0, -1.5],  # an int among doubles takes the per-element path
        "tags": ["a", 1, 2.5, True, ["nested", [3]], {"k": [4, "v"]}],
        "empty": [],
    }
    req, _ = make_request(3, attributes=attributes, resource={"langs": ["py", "go"]})
    req.resource_spans[0].scope_spans[0].spans[0].events.add(
        name="e", time_unix_nano=5
    ).attributes.add(key="xs").value.array_value.values.add(int_value=9)
    standard = encode_request(req)
    parsed = encode_request(decode_protobuf_request(req.SerializeToString()))
    assert parsed.error_message == standard.error_message == ""
    assert parsed.table.equals(standard.table)
    row = parsed.table.to_pylist()[0]
    assert row["prompt_token_ids"] == [0, 1, 300, 70000, 2**31 - 1, -5] and row["completion_token_ids"] == []
    assert row["logprobs"] == [-0.25, 0.0, -1.5]


@pytest.mark.parametrize(
    "raw",
    [
        _ints(1, 2)[:-1],  # truncated element
        b"\x0a\x05\x0a\x03\xff\xfe\xfd",  # an element whose string is not UTF-8
        b"\x0a\x02\x18\x81",  # an unterminated varint
    ],
)
def test_malformed_token_array_fails_the_whole_request(raw):
    with pytest.raises(PermanentError, match="malformed OTLP protobuf"):
        encode_request(decode_protobuf_request(_with_raw_array(raw)))


def test_malformed_array_in_an_ordinary_attribute_fails_the_whole_request():
    with pytest.raises(PermanentError, match="malformed OTLP protobuf"):
        encode_request(decode_protobuf_request(_with_raw_array(b"\x0a\x05\x0a\x03\xff\xfe\xfd", key="tags")))


def test_arrays_that_parse_only_when_joined_are_refused():
    """Two spans' arrays are decoded in one numpy pass; neither alone is valid, joined they would be."""
    first = _with_raw_array(b"\x0a\x02\x18")  # an element cut after its int tag
    second = _with_raw_array(bytes([5]) + _ints(7))  # ... and the rest of it
    req_a, req_b = decode_protobuf_request(first), decode_protobuf_request(second)
    req_a.resource_spans[0].scope_spans[0].spans.append(req_b.resource_spans[0].scope_spans[0].spans[0])
    with pytest.raises(PermanentError, match="malformed OTLP protobuf"):
        encode_request(req_a)


def test_grpc_answers_a_malformed_array_with_invalid_argument(tmp_path):
    config = CollectorConfig(db_path=str(tmp_path / "w.duckdb"), grpc_port=0, http_port=-1)
    with Collector(config) as collector, grpc.insecure_channel(collector.grpc_endpoint) as channel:
        call = channel.unary_unary(_EXPORT, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        with pytest.raises(grpc.RpcError) as err:
            call(_with_raw_array(_ints(1, 2)[:-1]), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed OTLP protobuf" in err.value.details()
        call(_with_raw_array(_ints(1, 2, 3)), timeout=30)  # the same request, well formed, is stored
        assert (collector.store.sql("SELECT prompt_token_ids FROM spans").to_pylist()
                == [{"prompt_token_ids": [1, 2, 3]}])

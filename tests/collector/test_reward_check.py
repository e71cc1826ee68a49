"""Unusable rewards are rejected per span at ingest, whichever receiver and decoder (issue 28 items 2-3).

A reward of 1e200 passes a float64 finiteness check and overflowed float32 in the loss; NaN and inf
stopped online training. Each is sent here through a real collector (gRPC and HTTP, protobuf and
OTLP/JSON, the C fast path and the Python decoder): the span is refused with its reason, the rest of
the request is stored.
"""

from __future__ import annotations

import json
import urllib.request

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from spanrl import semconv as sc
from spanrl.collector import Collector, CollectorConfig
from spanrl.collector.fast_decode import active_decoder, decode_body, fast_available
from spanrl.errors import ConfigError
from _otlp import kv, make_request

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_BAD = {"1e200": 1e200, "nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "1e7": 1e7, "1e308": 1e308}


def _grpc(collector, body: bytes) -> ExportTraceServiceResponse:
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        call = channel.unary_unary(_EXPORT, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        return call(body, timeout=30)


def _http(collector, body: bytes, ctype: str) -> bytes:
    req = urllib.request.Request(f"{collector.http_endpoint}/v1/traces", data=body, headers={"content-type": ctype},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        return resp.read()


def _stored(collector, ids: list[str]) -> set[str]:
    rows = collector.store.sql("SELECT span_id FROM spans WHERE span_id IN (SELECT unnest(?))", [ids]).to_pylist()
    return {r["span_id"] for r in rows}


def _request(value: float, *, as_event: bool = False, key: str = sc.REWARD_VALUE):
    """Three spans: a good reward, the bad one (attribute or event), a span without a reward."""
    req, ids = make_request(3, rollout_id="r-bad")
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[0].attributes.append(kv(sc.REWARD_VALUE, 0.5))
    if as_event:
        event = spans[1].events.add(name=sc.REWARD_SPAN_NAME if key == sc.REWARD_VALUE
                                    else sc.GEN_AI_EVALUATION_RESULT_EVENT,
                                    time_unix_nano=5)
        event.attributes.append(kv(key, value))
    else:
        spans[1].attributes.append(kv(key, value))
    return req, ids


@pytest.mark.parametrize("decoder", ["c", "python"])
@pytest.mark.parametrize("bad", list(_BAD))
def test_unusable_reward_attribute_rejects_that_span_over_grpc(tmp_path, monkeypatch, decoder, bad):
    if decoder == "python":
        monkeypatch.setenv("SPANRL_COLLECTOR_DECODER", "python")  # before the start: the collector reads it once
    elif not fast_available():
        pytest.skip("the C fast path is not built")
    req, ids = _request(_BAD[bad])
    if decoder == "c":
        assert decode_body(req.SerializeToString()) is not None  # the fast path really decodes it
    with Collector(CollectorConfig(db_path=str(tmp_path / "spans.duckdb"), grpc_port=0, http_port=-1)) as collector:
        assert active_decoder().startswith("python") == (decoder == "python")
        reply = _grpc(collector, req.SerializeToString())
        assert reply.partial_success.rejected_spans == 1
        message = reply.partial_success.error_message
        assert ids[1] in message and "must be a finite number in [-1e+06, 1e+06]" in message, message
        assert _stored(collector, ids) == {ids[0], ids[2]}


@pytest.mark.parametrize("key", [sc.REWARD_VALUE, sc.GEN_AI_EVALUATION_SCORE_VALUE])
@pytest.mark.parametrize("bad", ["1e200", "nan", "-inf"])
def test_unusable_reward_event_rejects_that_span_over_http(collector, key, bad):
    req, ids = _request(_BAD[bad], as_event=True, key=key)
    reply = ExportTraceServiceResponse.FromString(_http(collector, req.SerializeToString(), "application/x-protobuf"))
    assert reply.partial_success.rejected_spans == 1
    assert f"{key} must be a finite number" in reply.partial_success.error_message
    assert _stored(collector, ids) == {ids[0], ids[2]}


def test_unusable_reward_in_otlp_json_is_rejected_with_the_other_bad_spans(collector):
    span = lambda sid, attrs: {"traceId": "ab" * 16, "spanId": sid, "name": "judge", "startTimeUnixNano": "1",  # noqa: E731
                               "endTimeUnixNano": "2", "attributes": attrs}
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [
        span("01" * 8, [{"key": sc.REWARD_VALUE, "value": {"doubleValue": 1.0}}]),
        span("02" * 8, [{"key": sc.REWARD_VALUE, "value": {"doubleValue": "Infinity"}}]),
        span("03" * 8, [{"key": sc.REWARD_VALUE, "value": {"stringValue": "1e200"}}]),
        span("zz", []),  # a bad id: rejected by the JSON decoder
    ]}]}]}
    reply = json.loads(_http(collector, json.dumps(doc).encode(), "application/json"))
    assert reply["partialSuccess"]["rejectedSpans"] == "3"
    message = reply["partialSuccess"]["errorMessage"]
    assert message.startswith("3 span(s) rejected: ") and "0202020202020202" in message and "1e+200" in message, message
    assert _stored(collector, ["01" * 8, "02" * 8, "03" * 8]) == {"01" * 8}


def test_label_only_evaluation_event_and_range_edges_are_kept(collector):
    req, ids = make_request(3, rollout_id="r-ok")
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[0].attributes.append(kv(sc.REWARD_VALUE, -1e6))
    spans[1].attributes.append(kv(sc.GEN_AI_EVALUATION_SCORE_VALUE, 1e6))
    event = spans[2].events.add(name=sc.GEN_AI_EVALUATION_RESULT_EVENT, time_unix_nano=5)
    event.attributes.append(kv(sc.GEN_AI_EVALUATION_SCORE_LABEL, "good"))
    assert not _grpc(collector, req.SerializeToString()).HasField("partial_success")
    assert _stored(collector, ids) == set(ids)


def test_a_narrower_reward_range_is_enforced_and_a_wider_one_refused(tmp_path):
    with Collector(CollectorConfig(db_path=str(tmp_path / "s.duckdb"), grpc_port=0, http_port=-1,
                                   reward_range=(0.0, 1.0))) as c:
        req, ids = _request(1.5)
        reply = _grpc(c, req.SerializeToString())
        assert reply.partial_success.rejected_spans == 1 and "in [0, 1], got 1.5" in reply.partial_success.error_message
    for bad in [(-1e7, 1.0), (1.0, 0.0), (float("nan"), 1.0), (0.0,)]:
        with pytest.raises(ConfigError,
                           match=r"reward_range must be \(low, high\) with -1e\+06 <= low <= high <= 1e\+06"):
            CollectorConfig(reward_range=bad).validate()

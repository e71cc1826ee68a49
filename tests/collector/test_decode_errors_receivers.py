"""The decode path's errors as both receivers answer them: nesting past the limit and any error of the
decoders are permanent (400 / INVALID_ARGUMENT, with the reason), running out of memory is retryable,
and the amplifying request (a large resource repeated in every span's row) is refused before its decoded
form passes the memory budget, never stored past it (issue 36)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from _native import require_fast_path
from spanrl.collector import Collector, CollectorConfig, encoding
from spanrl.collector.encoding import MAX_NESTING
from test_decoder_findings import _nested, amplifying_body

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_MiB = 1 << 20


def _http(collector, body: bytes, ctype: str = "application/x-protobuf") -> tuple[int, dict, str]:
    req = urllib.request.Request(f"{collector.http_endpoint}/v1/traces", data=body, headers={"content-type": ctype},
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, dict(resp.headers), ""
    except urllib.error.HTTPError as exc:
        reply = exc.read()
        message = (json.loads(reply)["message"] if ctype == "application/json"
                   else status_pb2.Status.FromString(reply).message)
        return exc.code, dict(exc.headers), message


def _grpc(collector, body: bytes) -> tuple[grpc.StatusCode, str, dict]:
    with grpc.insecure_channel(collector.grpc_endpoint,
                               options=[("grpc.max_send_message_length", 64 * _MiB)]) as channel:
        call = channel.unary_unary(_EXPORT, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        try:
            call(body, timeout=120)
        except grpc.RpcError as exc:
            return exc.code(), exc.details(), dict(exc.trailing_metadata() or ())
    return grpc.StatusCode.OK, "", {}


def _spans(collector) -> int:
    return int(collector.store.sql("SELECT count(*) AS n FROM spans").column("n")[0].as_py())


@pytest.fixture
def budgeted(tmp_path, monkeypatch, request):
    """A collector with a 64 MiB budget, started with the test's ``decoder`` parameter (if any) as
    SPANRL_COLLECTOR_DECODER: the collector picks its decoder once, at start."""
    require_fast_path()
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    if "decoder" in params:
        monkeypatch.setenv("SPANRL_COLLECTOR_DECODER", params["decoder"])
    config = CollectorConfig(db_path=str(tmp_path / "s.duckdb"), grpc_port=0, http_port=0, max_inflight_bytes=64 * _MiB)
    with Collector(config) as c:
        yield c


def _json_nested(depth: int) -> bytes:
    value = '{"arrayValue":{"values":[' * depth + '{"intValue":"1"}' + "]}}" * depth  # as text: json.dumps recurses
    span = (f'{{"traceId":"{"01" * 16}","spanId":"{"02" * 8}","name":"s",'
            f'"attributes":[{{"key":"deep","value":{value}}}]}}')
    return f'{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{span}]}}]}}]}}'.encode()


@pytest.mark.parametrize(("depth", "kinds"),
                         [(MAX_NESTING + 1, "a"), (300, "a"), (2000, "a"), (MAX_NESTING + 1, "k"), (40, "ak")])
def test_nesting_past_the_limit_is_400_and_invalid_argument_with_the_reason(budgeted, depth, kinds):
    """Was: from 254 arrays an uncaught TypeError, answered 503 / UNAVAILABLE: exporters retried it for ever."""
    body = _nested(depth, kinds)
    status, headers, message = _http(budgeted, body)
    assert status == 400 and "retry-after" not in headers
    code, details, meta = _grpc(budgeted, body)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "google.rpc.retryinfo-bin" not in meta
    if kinds == "a" or depth == MAX_NESTING + 1:
        assert f"more than {MAX_NESTING} deep" in message and f"more than {MAX_NESTING} deep" in details
    assert _spans(budgeted) == 0
    assert (_http(budgeted, _nested(MAX_NESTING))[0] == 200 and _grpc(budgeted, _nested(MAX_NESTING))[0]
            == grpc.StatusCode.OK)


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 40, 400])
def test_otlp_json_nesting_past_the_limit_is_400(budgeted, depth):
    status, headers, message = _http(budgeted, _json_nested(depth), "application/json")
    assert status == 400 and "retry-after" not in headers
    if depth < 40:
        assert f"more than {MAX_NESTING} deep" in message
    assert _http(budgeted, _json_nested(MAX_NESTING), "application/json")[0] == 200


@pytest.mark.parametrize(("raised", "http_status", "grpc_code", "said"), [
    (TypeError("Recursion limit reached"), 400, grpc.StatusCode.INVALID_ARGUMENT, "TypeError: Recursion limit reached"),
    (RecursionError("maximum recursion depth exceeded"), 400, grpc.StatusCode.INVALID_ARGUMENT, "nested too deeply"),
    (ValueError("bad"), 400, grpc.StatusCode.INVALID_ARGUMENT, "ValueError: bad"),
    (MemoryError(), 503, grpc.StatusCode.UNAVAILABLE, "ran out of memory"),
])
@pytest.mark.parametrize("decoder", ["python"])
def test_every_decode_error_is_mapped_on_purpose_by_both_receivers(budgeted, monkeypatch, raised, http_status,
                                                                   grpc_code, said, decoder):
    """Before: anything but the collector's own errors reached the receivers' catch-all, answered as
    retryable (503 / UNAVAILABLE) whatever it was."""
    def fail(*args, **kwargs):
        raise raised

    monkeypatch.setattr(encoding, "_span_row", fail)
    body = _nested(1)
    status, headers, message = _http(budgeted, body)
    code, details, meta = _grpc(budgeted, body)
    assert (status, code) == (http_status, grpc_code)
    if http_status == 503:
        assert headers["retry-after"] == "1" and "google.rpc.retryinfo-bin" in meta
    else:
        assert "retry-after" not in headers and "google.rpc.retryinfo-bin" not in meta
    assert said in message and said in details


@pytest.mark.parametrize("decoder", ["auto", "python"])
def test_the_amplifying_request_is_refused_by_both_receivers_and_nothing_is_stored(budgeted, monkeypatch, decoder):
    """0.19 MB body, ~301 MB decoded (the resource's JSON in 3,000 rows): past the 64 MiB budget it can
    never fit, so it is refused for good (413 / INVALID_ARGUMENT, no retry)."""
    body = amplifying_body()
    status, headers, message = _http(budgeted, body)
    assert status == 413 and "could never be admitted" in message and "retry-after" not in headers
    code, details, meta = _grpc(budgeted, body)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "could never be admitted" in details
    assert _spans(budgeted) == 0
    assert _http(budgeted, amplifying_body(spans=100))[0] == 200  # 100 rows of it fit: stored
    assert _spans(budgeted) == 100


def _hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("decoder", ["auto", "python"])
def test_the_collectors_peak_memory_stays_within_the_budget_for_the_amplifying_request(collector_proc_factory,
                                                                                       monkeypatch, decoder):
    """A real collector process (max_inflight_bytes 64 MiB): its peak RSS grows by less than the 301 MB
    the request would decode to (before the fix: the whole decoded form, ~300-600 MB, and stored)."""
    require_fast_path()
    monkeypatch.setenv("SPANRL_COLLECTOR_MAX_INFLIGHT_BYTES", str(64 * _MiB))
    monkeypatch.setenv("SPANRL_COLLECTOR_DECODER", decoder)
    proc = collector_proc_factory(name=f"amp-{decoder}")
    body = amplifying_body()
    before = _hwm_kib(proc.proc.pid)
    req = urllib.request.Request(f"{proc.http_endpoint}/v1/traces", data=body,
                                 headers={"content-type": "application/x-protobuf"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=120)
    assert err.value.code == 413
    grown_mib = (_hwm_kib(proc.proc.pid) - before) / 1024
    assert grown_mib < 64 + 96, grown_mib  # the budget, plus the body, its parse and Python's own
    assert proc.sql("SELECT count(*) AS n FROM spans") == [{"n": 0}]

"""Build OTLP requests for tests and the benchmark-like checks."""

from __future__ import annotations

import base64
import os
from typing import Any

import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2


def any_value(value: Any) -> common_pb2.AnyValue:
    if isinstance(value, bool):
        return common_pb2.AnyValue(bool_value=value)
    if isinstance(value, int):
        return common_pb2.AnyValue(int_value=value)
    if isinstance(value, float):
        return common_pb2.AnyValue(double_value=value)
    if isinstance(value, bytes):
        return common_pb2.AnyValue(bytes_value=value)
    if isinstance(value, (list, tuple)):
        return common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[any_value(v) for v in value]))
    if isinstance(value, dict):
        return common_pb2.AnyValue(kvlist_value=common_pb2.KeyValueList(values=[kv(k, v) for k, v in value.items()]))
    return common_pb2.AnyValue(string_value=str(value))


def kv(key: str, value: Any) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=any_value(value))


def b64_int32(values: Any) -> str:
    return base64.b64encode(np.asarray(values, dtype="<i4").tobytes()).decode()


def make_request(
    n_spans: int,
    *,
    rollout_id: str = "r1",
    name: str = "span",
    attributes: dict[str, Any] | None = None,
    resource: dict[str, Any] | None = None,
) -> tuple[ExportTraceServiceRequest, list[str]]:
    """A request of ``n_spans`` spans in one trace; returns it and the hex span ids."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(kv(k, v) for k, v in {"service.name": "test-agent", "spanrl.rollout.id": rollout_id,
                                                        **(resource or {})}.items())
    ss = rs.scope_spans.add()
    ss.scope.name = "tests"
    trace_id = os.urandom(16)
    ids = []
    for i in range(n_spans):
        sid = os.urandom(8)
        span = ss.spans.add(trace_id=trace_id, span_id=sid, name=name, kind=1, start_time_unix_nano=1_000 + i,
                            end_time_unix_nano=2_000 + i)
        span.attributes.extend(kv(k, v) for k, v in {"i": i, **(attributes or {})}.items())
        ids.append(sid.hex())
    return req, ids

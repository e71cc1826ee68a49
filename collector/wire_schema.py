"""The OTLP trace schema as the collector parses it: `AnyValue.array_value` kept as its wire bytes.

A plain OTLP array is one `AnyValue` message per element: upb builds 420 of them for an LLM span with
300 + 60 prompt/completion ids and 60 log-probs, and the token decoder then serialized them back to
bytes to read them with numpy. Here the same `.proto` files are loaded into a private descriptor pool
with one change, `array_value` declared `bytes` (the wire format of a length-delimited field is the same
for bytes and a message), so upb copies each array's bytes once and builds nothing per element.

Nothing goes unchecked: the token decoder (`tokens.py`) accepts an array's bytes only in the exact
shape of integers (or doubles), which carries no string; anything else, and every other array (read
for the attributes' JSON), is parsed with a real message class here, which validates it as upb would
have (truncation, bad UTF-8): a malformed one fails the whole request as a malformed body did before.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from spanrl.collector.errors import PermanentError

__all__ = ["parse_array", "parse_request", "parse_strict_array"]

_COMMON_PACKAGE = "opentelemetry.proto.common.v1"


def _lazy_classes() -> tuple[Any, Any]:
    pool = descriptor_pool.DescriptorPool()
    for module in (common_pb2, resource_pb2, trace_pb2, trace_service_pb2):  # dependencies first
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        if proto.package == _COMMON_PACKAGE:
            any_value = next(m for m in proto.message_type if m.name == "AnyValue")
            field = next(f for f in any_value.field if f.name == "array_value")
            field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
            field.ClearField("type_name")
        pool.Add(proto)
    request = pool.FindMessageTypeByName("opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest")
    array = pool.FindMessageTypeByName(f"{_COMMON_PACKAGE}.ArrayValue")
    return message_factory.GetMessageClass(request), message_factory.GetMessageClass(array)


_LazyRequest, _LazyArray = _lazy_classes()


def parse_request(body: bytes) -> Any:
    """An OTLP protobuf body -> ExportTraceServiceRequest whose arrays are bytes; `PermanentError` if malformed."""
    try:
        return _LazyRequest.FromString(body)
    except Exception as exc:  # upb raises google.protobuf.message.DecodeError
        raise PermanentError(f"malformed OTLP protobuf ExportTraceServiceRequest ({len(body)} bytes): {exc}") from None


def parse_array(buf: bytes) -> Any:
    """An array's wire bytes -> ArrayValue (its nested arrays bytes again); `PermanentError` if malformed."""
    return _array_from(_LazyArray, buf)


def parse_strict_array(buf: bytes) -> common_pb2.ArrayValue:
    """An array's wire bytes -> the standard ArrayValue (elements are messages, for naming a bad one)."""
    return _array_from(common_pb2.ArrayValue, buf)


def _array_from(array_class: Any, buf: bytes) -> Any:
    try:
        return array_class.FromString(buf)
    except Exception as exc:  # noqa: BLE001 - DecodeError
        raise PermanentError(
            f"malformed OTLP protobuf: an ArrayValue ({len(buf)} bytes) does not parse: {exc}"
        ) from None


"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

The handler takes the raw request bytes (so a malformed body is INVALID_ARGUMENT, not grpcio's
INTERNAL), parses and walks them in its own thread, queues the batch and answers only after the commit.
Errors: UNAUTHENTICATED (token), INVALID_ARGUMENT (malformed), UNAVAILABLE (queue full, shutting
down: retryable), RESOURCE_EXHAUSTED from grpcio itself for a message over max_request_bytes.
"""

from __future__ import annotations

import hmac
import logging
from concurrent import futures
from typing import Protocol

import grpc
from concurrent.futures import Future
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from spanrl.collector.encoding import EncodedBatch, decode_protobuf_request, encode_request
from spanrl.collector.errors import PermanentError, RetryableError
from spanrl.errors import CollectorError

__all__ = ["BatchConsumer", "GrpcReceiver"]

_logger = logging.getLogger(__name__)

_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_METHOD = "Export"


class BatchConsumer(Protocol):
    """The batcher, as receivers see it."""

    def consume(self, batch: EncodedBatch) -> "Future[int]":
        """Queue the batch; the future resolves after commit. Raises `RetryableError` when full."""


def _bearer_ok(header: str | None, token: str | None) -> bool:
    if token is None:
        return True
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


class GrpcReceiver:
    """A grpcio server with the TraceService handler, feeding ``next_consumer``."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        token: str | None,
        max_request_bytes: int,
        workers: int,
        max_concurrent_rpcs: int,
        next_consumer: BatchConsumer,
    ) -> None:
        self._host = host
        self._requested_port = port
        self._token = token
        self._max_request_bytes = max_request_bytes
        self._workers = workers
        self._max_concurrent_rpcs = max_concurrent_rpcs
        self._next = next_consumer
        self._server: grpc.Server | None = None
        self.port: int | None = None
        """The bound port, once started."""

    def start(self) -> None:
        """Bind and serve. Raises `CollectorError` when the port cannot be bound."""
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="spanrl-grpc"),
            handlers=[
                grpc.method_handlers_generic_handler(
                    _SERVICE,
                    {_METHOD: grpc.unary_unary_rpc_method_handler(self._export, response_serializer=ExportTraceServiceResponse.SerializeToString)},
                )
            ],
            options=[
                ("grpc.max_receive_message_length", self._max_request_bytes),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=self._max_concurrent_rpcs,
        )
        address = f"{self._host}:{self._requested_port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise CollectorError(f"cannot bind OTLP/gRPC on {address}: {exc}") from exc
        if port == 0:
            raise CollectorError(f"cannot bind OTLP/gRPC on {address} (port in use?)")
        server.start()
        self._server = server
        self.port = port

    def shutdown(self, timeout: float | None = None) -> None:
        """Refuse new RPCs and wait up to ``timeout`` for in-flight ones. Safe before start or twice."""
        if self._server is not None:
            self._server.stop(grace=timeout).wait(timeout)
            self._server = None

    def _export(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        if self._token is not None:
            metadata = dict(context.invocation_metadata())
            if not _bearer_ok(metadata.get("authorization"), self._token):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (metadata 'authorization: Bearer <token>')")
        try:
            request = decode_protobuf_request(body)
            if not request.resource_spans:
                return ExportTraceServiceResponse()
            batch = encode_request(request)
            committed = self._next.consume(batch)
            committed.result()
        except PermanentError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except RetryableError as exc:
            context.set_trailing_metadata((("retry-after", str(exc.retry_after_s)),))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception as exc:  # noqa: BLE001 - never leak a stack to the client; keep the data retryable
            _logger.exception("OTLP/gRPC export failed")
            context.abort(grpc.StatusCode.UNAVAILABLE, f"collector error: {exc}")
        response = ExportTraceServiceResponse()
        if batch.rejected:
            response.partial_success.rejected_spans = batch.rejected
            response.partial_success.error_message = batch.error_message
        return response

"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``, and
``opentelemetry.proto.collector.logs.v1.LogsService/Export`` for GenAI events sent as log records (each stored as a
span of its own, collector/logs.py; a record without an event name is counted as rejected).

The method is registered as client-streaming (a unary call is the same on the wire): the handler
runs before the request message is read, so a request over the concurrency cap is refused without
its body ever being received. It then reads the raw bytes (a malformed body is INVALID_ARGUMENT, not
grpcio's INTERNAL), reserves their decoding memory, decodes them in its own thread (`fast_decode`), queues
the batch and answers only after the commit.
Errors: UNAUTHENTICATED (a token of scope ``ingest`` is needed when one is configured, spanrl.trust),
INVALID_ARGUMENT (malformed), UNAVAILABLE with RetryInfo (over the
concurrency cap or the memory budget, queue full, shutting down: retryable), RESOURCE_EXHAUSTED from
grpcio itself for a message over max_request_bytes (permanent: no RetryInfo).
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from typing import Iterator, Protocol

import grpc
from concurrent.futures import Future
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from spanrl.collector.admission import DECODE_FACTOR, Admission, DecodeBudget
from spanrl.collector.encoding import EncodedBatch
from spanrl.collector.errors import PermanentError, RetryableError
from spanrl.collector.fast_decode import encode_protobuf_body, fast_enabled
from spanrl.collector.logs import decode_logs, logs_response
from spanrl.errors import CollectorError
from spanrl.http_server import bracketed
from spanrl.trust import Tokens

__all__ = ["BatchConsumer", "GrpcReceiver"]

_logger = logging.getLogger(__name__)

_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
_METHOD = "Export"
# Threads beyond the concurrency cap: so a call over the cap finds a thread that refuses it at once.
_SPARE_WORKERS = 16
# Bodies received at once. A gRPC body has no announced size, so its bytes can be reserved only once it
# is in memory: this caps what is held before that at _RECEIVING x max_request_bytes. Each holds its slot
# for at most the receive deadline (`GrpcReceiver`), so idle calls cannot keep the others out.
_RECEIVING = 4
_RECEIVE_WAIT_S = 30.0


class BatchConsumer(Protocol):
    """The batcher, as receivers see it."""

    def consume(self, batch: EncodedBatch) -> "Future[int]":
        """Queue the batch; the future resolves after commit. Raises `RetryableError` when full."""


class GrpcReceiver:
    """A grpcio server with the TraceService handler, feeding ``next_consumer``."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        tokens: Tokens,
        max_request_bytes: int,
        max_concurrent_rpcs: int,
        admission: Admission,
        next_consumer: BatchConsumer,
        fast_decoder: bool | None = None,
        receive_timeout_s: float = 10.0,
    ) -> None:
        """``receive_timeout_s``: how long a call may hold a receive slot before its whole request arrives; past
        it the call is cancelled (4 idle client-streaming calls held every slot with no limit)."""
        self._receive_timeout_s = receive_timeout_s
        self._fast = fast_enabled() if fast_decoder is None else fast_decoder  # decided once, as the start-up log says
        self._host = host
        self._requested_port = port
        self._tokens = tokens
        self._max_request_bytes = max_request_bytes
        self._workers = max_concurrent_rpcs + _SPARE_WORKERS
        self._admission = admission
        self._receiving = threading.BoundedSemaphore(_RECEIVING)
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
                    {_METHOD: grpc.stream_unary_rpc_method_handler(
                        self._export, response_serializer=ExportTraceServiceResponse.SerializeToString
                    )},
                ),
                grpc.method_handlers_generic_handler(
                    _LOGS_SERVICE,
                    {_METHOD: grpc.stream_unary_rpc_method_handler(
                        self._export_logs, response_serializer=ExportLogsServiceResponse.SerializeToString
                    )},
                ),
            ],
            options=[
                ("grpc.max_receive_message_length", self._max_request_bytes),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
                ("grpc.so_reuseport", 0),
            ],
        )
        address = f"{bracketed(self._host)}:{self._requested_port}"
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

    def _export_logs(self, messages: Iterator[bytes], context: grpc.ServicerContext) -> ExportLogsServiceResponse:
        response = self._export(messages, context, logs=True)
        return logs_response(response.partial_success.rejected_spans, response.partial_success.error_message)

    def _export(self, messages: Iterator[bytes], context: grpc.ServicerContext, *,
                logs: bool = False) -> ExportTraceServiceResponse:
        authorization = dict(context.invocation_metadata()).get("authorization")
        if not self._tokens.allows(authorization, "ingest"):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, self._tokens.refusal(
                "ingest", "OTLP/gRPC Export", "--ingest-token-file (or --token-file for every scope)"))
        try:
            self._admission.enter("OTLP/gRPC")
        except RetryableError as exc:
            _abort_retryable(context, exc)
        try:
            return self._admitted(messages, context, authorization, logs)
        finally:
            self._admission.leave()

    def _admitted(
        self, messages: Iterator[bytes], context: grpc.ServicerContext, authorization: str | None, logs: bool
    ) -> ExportTraceServiceResponse:
        if not self._receiving.acquire(timeout=_RECEIVE_WAIT_S):
            busy = RetryableError(f"{_RECEIVING} request bodies are being received, the limit; retry later",
                                  retry_after_s=self._admission.retry_after_s)
            _abort_retryable(context, busy)
        budget = DecodeBudget(self._admission)  # the body's share now, more as its decoded form grows
        deadline = threading.Timer(self._receive_timeout_s, _cancel_slow, (context, self._receive_timeout_s))
        deadline.daemon = True
        deadline.start()
        try:
            body = next(messages, None)
            if body is None or next(messages, None) is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              "Export takes exactly one ExportTraceServiceRequest message")

            budget.hold(len(body) * DECODE_FACTOR)
            budget.body_bytes = len(body)
        except RetryableError as exc:
            _abort_retryable(context, exc)
        except grpc.RpcError:  # cancelled: by the client, or by the deadline (already logged)
            context.abort(grpc.StatusCode.CANCELLED, "the request did not arrive in time")
        finally:
            deadline.cancel()
            self._receiving.release()
        skipped, why = 0, ""
        try:
            if logs:  # GenAI events as log records: spans of their own (collector/logs.py)
                body, skipped, why = decode_logs(body, as_json=False)
            # the C fast path, else the Python decoder; raises only PermanentError / RetryableError
            batch = encode_protobuf_body(body, budget, fast=self._fast)
            del body
            if batch is None:  # no resource spans
                return _partial(skipped, why)
            batch.sender_scopes = self._tokens.scopes_of(authorization)
            committed = self._next.consume(batch)
            budget.release()
            committed.result()
        except PermanentError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except RetryableError as exc:
            _abort_retryable(context, exc)
        except Exception as exc:  # noqa: BLE001 - never leak a stack to the client; keep the data retryable
            _logger.exception("OTLP/gRPC export failed")
            _abort_retryable(context, RetryableError(f"collector error: {exc}"))
        finally:
            budget.release()
        return _partial(batch.rejected + skipped, "; ".join(m for m in (batch.error_message, why) if m))


def _partial(rejected: int, message: str) -> ExportTraceServiceResponse:
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    return response


def _cancel_slow(context: grpc.ServicerContext, timeout_s: float) -> None:
    """Cancel a call whose request did not arrive within the receive deadline (it frees its slot)."""
    _logger.warning("OTLP/gRPC Export from %s sent no whole request within %g s of taking a receive slot: "
                    "cancelled, freeing the slot", context.peer(), timeout_s)
    context.cancel()


def _abort_retryable(context: grpc.ServicerContext, exc: RetryableError) -> None:
    """UNAVAILABLE with the delay as RetryInfo, both where OTel SDKs read it (``google.rpc.retryinfo-bin``)
    and where gRPC's rich status puts it (``grpc-status-details-bin``), plus ``retry-after``."""
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=exc.retry_after_s))
    detail = any_pb2.Any()
    detail.Pack(retry)
    status = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message=str(exc), details=[detail])
    context.set_trailing_metadata((
        ("google.rpc.retryinfo-bin", retry.SerializeToString()),
        ("grpc-status-details-bin", status.SerializeToString()),
        ("retry-after", str(exc.retry_after_s)),
    ))
    context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

"""OTLP/HTTP receiver and the read-only SQL endpoint: a raw ASGI app served by uvicorn in a thread.

Routes:
    POST /v1/traces   OTLP/HTTP: application/x-protobuf or application/json, optionally gzip.
                      200 with ExportTraceServiceResponse (partial success counts rejected spans);
                      400 malformed, 401 token, 413 too large, 415 content type, 503 + Retry-After full.
                      Error bodies are a google.rpc.Status (protobuf, or JSON for JSON requests).
    POST /v1/logs     OTLP/HTTP logs, likewise: each GenAI event (a log record with an event name) is stored as a
                      span of its own (collector/logs.py); other records are counted as rejected.
    POST /v1/sql      {"sql": "SELECT ...", "params": [...]} -> rows; Accept
                      application/vnd.apache.arrow.stream gives an Arrow IPC stream, else JSON
                      {"columns": [...], "rows": [{...}, ...]}. Only SELECT / EXPLAIN of a SELECT,
                      no file access, interrupted after sql_timeout_s; 400 otherwise (see sql.py).
    POST /v1/prune    {"older_than_s": N} -> {"deleted_spans": n} (see spanrl.store.maintenance.prune).
    POST /v1/materialize  {} -> {"rollouts_kept": n, "rows_dropped": m} (spanrl.store.kept_rollouts.materialize).
    GET  /health      200 {"status": "ok", "db": ABSOLUTE_PATH}; 503 {"status": "failing" | "recovering" |
                      "failed", "error": ...} while commits fail (a full disk), while the store is reopened
                      after a DuckDB failure, or when it could not be (no token needed).
Scopes (spanrl.trust): /v1/traces and /v1/logs need an ``ingest`` token, /v1/sql ``read``, /v1/prune and /v1/materialize
``admin`` (401 otherwise). Fail closed: once any token is configured, a scope no token grants is closed
to everyone; with no token at all every scope is open, and only a loopback bind allows that (config.py).
Every request first passes `spanrl.trust.browser_refusal`: 403 for a foreign ``Origin`` or, bound to
loopback, a non-loopback ``Host``; 415 for a POST that is not protobuf / JSON (/v1/traces) or JSON (the others).
Over http_max_concurrency requests, or past the memory budget, a request gets 503 + Retry-After with a
google.rpc.Status body before its body is read. Parsing and walking run in worker threads, SQL in its
own pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import zlib
from concurrent.futures import Future
from typing import Any, Callable

import orjson
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from spanrl.collector.admission import DECODE_FACTOR, Admission, DecodeBudget
from spanrl.collector.sender import RolloutClaims
from spanrl.collector.encoding import EncodedBatch
from spanrl.collector.fast_decode import decode_otlp_body, fast_enabled
from spanrl.collector.errors import PayloadTooLargeError, PermanentError, RetryableError, UnauthenticatedError
from spanrl.collector.grpc import BatchConsumer
from spanrl.collector.logs import decode_logs, logs_response
from spanrl.collector.retention import prune_and_forget
from spanrl.collector.sql import SqlRunner
from spanrl.errors import CollectorError, ConfigError, StoreError
from spanrl.http_server import Receive, Send, ThreadedServer, bind, respond
from spanrl.store import SpanStore
from spanrl.store.kept_rollouts import materialize
from spanrl.trust import Tokens, browser_refusal

__all__ = ["ARROW_STREAM_TYPE", "HttpReceiver"]

_logger = logging.getLogger(__name__)

ARROW_STREAM_TYPE = "application/vnd.apache.arrow.stream"
_PROTOBUF_TYPE = "application/x-protobuf"
_JSON_TYPE = "application/json"
_START_TIMEOUT_S = 10.0
_GRPC_INVALID_ARGUMENT = 3
_GRPC_UNAUTHENTICATED = 16
_GRPC_UNAVAILABLE = 14
_GRPC_RESOURCE_EXHAUSTED = 8
_GRPC_PERMISSION_DENIED = 7
# The scope each route needs (spanrl.trust.SCOPES) and the content types its POST may carry.
_ROUTES = {
    "/v1/traces": ("ingest", (_PROTOBUF_TYPE, _JSON_TYPE)),
    "/v1/logs": ("ingest", (_PROTOBUF_TYPE, _JSON_TYPE)),
    "/v1/sql": ("read", (_JSON_TYPE,)),
    "/v1/prune": ("admin", (_JSON_TYPE,)),
    "/v1/materialize": ("admin", (_JSON_TYPE,)),
}

# How an operator opens a closed scope (no token grants it): the collector's options.
_FIX = {scope: f"--{scope}-token-file (or --token-file for every scope)" for scope in ("ingest", "read", "admin")}

class _HttpError(Exception):
    def __init__(
        self, status: int, message: str, *, grpc_code: int, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.grpc_code = grpc_code
        self.headers = headers or []


def _gunzip(body: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise PermanentError(f"body says Content-Encoding gzip but is not valid gzip: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise PayloadTooLargeError(f"decompressed body is larger than max_request_bytes={limit}")
    if not d.eof:
        raise PermanentError("gzip body is truncated")
    return out


class OtlpHttpApp:
    """The ASGI application (usable on its own in tests)."""

    def __init__(self, *, tokens: Tokens, max_request_bytes: int, next_consumer: BatchConsumer, store: SpanStore,
                 admission: Admission, sql: SqlRunner, health: Callable[[], dict[str, Any]], bound_host: str,
                 claims: RolloutClaims | None = None, fast_decoder: bool | None = None) -> None:
        self._tokens = tokens
        self._fast = fast_enabled() if fast_decoder is None else fast_decoder  # decided once, as the start-up log says
        self._claims = claims
        self._bound_host = bound_host
        self._max = max_request_bytes
        self._next = next_consumer
        self._store = store
        self._admission = admission
        self._sql_runner = sql
        self._health = health

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        method = scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        as_json = headers.get("content-type", "").split(";")[0].strip().lower() == _JSON_TYPE
        body_done = method != "POST"

        async def tracked() -> dict[str, Any]:
            nonlocal body_done
            message = await receive()
            body_done = message["type"] == "http.disconnect" or not message.get("more_body", False)
            return message

        async def fail(
            status: int, grpc_code: int, message: str, as_json: bool, extra: list[tuple[bytes, bytes]] | None = None
        ) -> None:
            # A refusal decided before the body was read (caps, token) still drains it, chunk by chunk and
            # kept nowhere, so the sender reads the answer instead of a connection reset mid-upload.
            while not body_done:
                await tracked()
            await _error(send, status, grpc_code, message, as_json, extra)

        try:
            refusal = browser_refusal(method, headers, bound_host=self._bound_host,
                                      content_types=_ROUTES.get(path, ("", (_JSON_TYPE,)))[1])
            if refusal is not None:
                code = _GRPC_PERMISSION_DENIED if refusal[0] == 403 else _GRPC_INVALID_ARGUMENT
                raise _HttpError(refusal[0], refusal[1], grpc_code=code)
            if path == "/health":
                doc = self._health()
                doc["db"] = self._store.path if self._store.path == ":memory:" else os.path.abspath(self._store.path)
                await respond(send, 200 if doc["status"] == "ok" else 503, orjson.dumps(doc), _JSON_TYPE)
                return
            if path not in _ROUTES:
                raise _HttpError(404, f"no route {path}; use POST /v1/traces, /v1/logs, /v1/sql, /v1/prune, "
                                      "/v1/materialize or GET /health", grpc_code=5)
            if method != "POST":
                raise _HttpError(405, f"{path} takes POST, got {method}", grpc_code=12)
            scope = _ROUTES[path][0]
            if not self._tokens.allows(headers.get("authorization"), scope):
                raise UnauthenticatedError(self._tokens.refusal(scope, path, _FIX[scope]))
            self._admission.enter("OTLP/HTTP")
            try:
                await self._route(path, send, tracked, headers)
            finally:
                self._admission.leave()
        except _HttpError as exc:
            await fail(exc.status, exc.grpc_code, str(exc), as_json, exc.headers)
        except UnauthenticatedError as exc:
            await fail(401, _GRPC_UNAUTHENTICATED, str(exc), as_json, [(b"www-authenticate", b"Bearer")])
        except PayloadTooLargeError as exc:
            await fail(413, _GRPC_RESOURCE_EXHAUSTED, str(exc), as_json)
        except (PermanentError, StoreError) as exc:
            await fail(400, _GRPC_INVALID_ARGUMENT, str(exc), as_json)
        except RetryableError as exc:
            await fail(503, _GRPC_UNAVAILABLE, str(exc), as_json, [(b"retry-after", str(exc.retry_after_s).encode())])
        except Exception as exc:  # noqa: BLE001
            _logger.exception("HTTP %s %s failed", method, path)
            await fail(503, _GRPC_UNAVAILABLE, f"collector error: {exc}", as_json, [(b"retry-after", b"1")])

    async def _route(self, path: str, send: Send, receive: Receive, headers: dict[str, str]) -> None:
        # this request's bytes in the memory budget, released when it is queued or done
        held = DecodeBudget(self._admission)
        try:
            body = await self._read_body(receive, headers, held)
            if path in ("/v1/traces", "/v1/logs"):
                await self._traces(send, body, headers, held, logs=path == "/v1/logs")
            elif path == "/v1/sql":
                await self._sql(send, body, headers)
            elif path == "/v1/materialize":
                done = await asyncio.to_thread(materialize, self._store)
                await respond(send, 200, orjson.dumps(done), _JSON_TYPE)
            else:
                await self._prune(send, body)
        finally:
            held.release()

    async def _read_body(self, receive: Receive, headers: dict[str, str], held: DecodeBudget) -> bytes:
        length = headers.get("content-length")
        too_large = length is not None and length.isdigit() and int(length) > self._max
        if not too_large and length is not None and length.isdigit():
            held.hold(int(length) * DECODE_FACTOR)  # before reading: a refusal costs no memory
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise PermanentError("client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max:
                too_large = True
            if not too_large:
                chunks.append(chunk)
                held.hold_total(size * DECODE_FACTOR)  # chunked, or longer than announced
            more = message.get("more_body", False)
        # An oversized body is read to its end and dropped (memory stays bounded), so that the client,
        # still sending, gets the 413 instead of a reset connection.
        if too_large:
            raise PayloadTooLargeError(f"body of {size} bytes is larger than max_request_bytes={self._max}")
        body = b"".join(chunks)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding == "gzip":
            body = await asyncio.to_thread(_gunzip, body, self._max)
            held.hold_total(len(body) * DECODE_FACTOR)
        elif encoding not in ("identity", ""):
            raise _HttpError(415, f"Content-Encoding {encoding!r} is not supported; use gzip or none",
                             grpc_code=_GRPC_INVALID_ARGUMENT)
        return body

    async def _traces(self, send: Send, body: bytes, headers: dict[str, str], held: DecodeBudget, *,
                      logs: bool = False) -> None:
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in (_PROTOBUF_TYPE, _JSON_TYPE):
            raise _HttpError(415, f"Content-Type {ctype!r} is not supported; use {_PROTOBUF_TYPE} or {_JSON_TYPE}",
                             grpc_code=_GRPC_INVALID_ARGUMENT)
        held.body_bytes = len(body)
        as_json, skipped, why = ctype == _JSON_TYPE, 0, ""
        if logs:  # GenAI events as log records: the same path as spans of their own (collector/logs.py)
            body, skipped, why = await asyncio.to_thread(decode_logs, body, as_json=as_json)
        # off the event loop: decoding, the sender's rules and the reward check are CPU work on every span
        batch, committed = await asyncio.to_thread(self._decode_and_queue, body, as_json and not logs, held,
                                                   headers.get("authorization"))
        del body
        held.release()  # the batcher's queue cap counts the batch from here on
        await asyncio.wrap_future(committed)
        if logs:
            rejected, message = batch.rejected + skipped, "; ".join(m for m in (batch.error_message, why) if m)
            reply = logs_response(rejected, message)
            doc = {"partialSuccess": {"rejectedLogRecords": str(rejected), "errorMessage": message}} if rejected else {}
            await respond(send, 200, *((orjson.dumps(doc), _JSON_TYPE) if as_json
                                       else (reply.SerializeToString(), _PROTOBUF_TYPE)))
        elif ctype == _JSON_TYPE:
            doc: dict[str, Any] = {}
            if batch.rejected:
                doc["partialSuccess"] = {"rejectedSpans": str(batch.rejected), "errorMessage": batch.error_message}
            await respond(send, 200, orjson.dumps(doc), _JSON_TYPE)
        else:
            response = ExportTraceServiceResponse()
            if batch.rejected:
                response.partial_success.rejected_spans = batch.rejected
                response.partial_success.error_message = batch.error_message
            await respond(send, 200, response.SerializeToString(), _PROTOBUF_TYPE)

    def _decode_and_queue(self, body: bytes, as_json: bool, held: DecodeBudget,
                          authorization: str | None) -> tuple[EncodedBatch, Future[int]]:
        """Decode (the C fast path, else Python; raises only PermanentError / RetryableError), keep what the
        sender presented, and hand the batch on (the sender check, the reward check, then the batcher, all
        thread-safe)."""
        batch = decode_otlp_body(body, as_json=as_json, budget=held, fast=self._fast)
        batch.sender_scopes = self._tokens.scopes_of(authorization)
        return batch, self._next.consume(batch)

    async def _sql(self, send: Send, body: bytes, headers: dict[str, str]) -> None:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise PermanentError(f'SQL request must be JSON {{"sql": "...", "params": [...]}}: {exc}') from None
        if not isinstance(doc, dict) or not isinstance(doc.get("sql"), str):
            raise PermanentError('SQL request must be a JSON object with a string field "sql"')
        params = doc.get("params")
        if params is not None and not isinstance(params, (list, dict)):
            raise PermanentError(f'"params" must be an array or an object, got {type(params).__name__}')
        arrow = ARROW_STREAM_TYPE in headers.get("accept", "")
        payload = await self._sql_runner.query(doc["sql"], params, arrow=arrow)
        await respond(send, 200, payload, ARROW_STREAM_TYPE if arrow else _JSON_TYPE)


    async def _prune(self, send: Send, body: bytes) -> None:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise PermanentError(f'prune request must be JSON {{"older_than_s": N}}: {exc}') from None
        older = doc.get("older_than_s") if isinstance(doc, dict) else None
        if isinstance(older, bool) or not isinstance(older, (int, float)) or older < 0:
            raise PermanentError(f'prune request needs "older_than_s" as a number >= 0, got {older!r}')
        try:
            deleted = await asyncio.to_thread(prune_and_forget, self._store, float(older), self._claims)
        except ConfigError as exc:  # out of range (1e308 was a retryable 503): the request is wrong
            raise PermanentError(f'prune request "older_than_s": {exc}') from None
        await respond(send, 200, orjson.dumps({"deleted_spans": deleted}), _JSON_TYPE)


async def _error(
    send: Send, status: int, grpc_code: int, message: str, as_json: bool, extra: list[tuple[bytes, bytes]] | None = None
) -> None:

    if as_json:
        await respond(send, status, orjson.dumps({"code": grpc_code, "message": message}), _JSON_TYPE, extra)
    else:
        body = status_pb2.Status(code=grpc_code, message=message).SerializeToString()
        await respond(send, status, body, _PROTOBUF_TYPE, extra)


class HttpReceiver:
    """Runs `OtlpHttpApp` under uvicorn on its own thread and event loop."""

    def __init__(self, *, host: str, port: int, app: OtlpHttpApp, graceful_timeout_s: float) -> None:
        self._graceful_timeout_s = graceful_timeout_s
        self._host = host
        self._requested_port = port
        self._app = app
        self._server: ThreadedServer | None = None
        self.port: int | None = None
        """The bound port, once started."""

    def start(self) -> None:
        """Bind and serve; returns once uvicorn is accepting. Raises `CollectorError` on failure."""
        try:
            sock = bind(self._host, self._requested_port, backlog=4096)
        except OSError as exc:
            raise CollectorError(f"cannot bind OTLP/HTTP on {self._host}:{self._requested_port}: {exc}") from exc
        # No uvicorn limit_concurrency: its refusal is a plain-text 503 without Retry-After. The app
        # admits requests itself (OtlpHttpApp, Admission) and refuses with a proper retryable 503.
        self._server = ThreadedServer(self._app, sock, name="spanrl-http", backlog=4096, timeout_keep_alive=30,
                                      timeout_graceful_shutdown=max(1, int(self._graceful_timeout_s)))
        self.port = self._server.port
        if not self._server.start(_START_TIMEOUT_S):
            raise CollectorError(f"OTLP/HTTP server did not start on {self._host}:{self.port}")

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting, finish in-flight requests, stop the thread. Safe before start or twice."""
        if self._server is not None:
            self._server.shutdown(timeout)
        self._server = None

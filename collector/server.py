"""`Collector`: both OTLP receivers, the batcher and the DuckDB writer in one process.

    from spanrl.collector import Collector, CollectorConfig
    with Collector(CollectorConfig(db_path="x.duckdb", grpc_port=0, http_port=0)) as c:
        print(c.grpc_endpoint, c.http_endpoint)     # real ports
        c.store.sql("SELECT count(*) FROM spans")   # same connection: the trainer reads through it

Shutdown order: receivers stop taking requests and finish in-flight ones, the batcher commits what is
queued, the store checkpoints and closes. Every acknowledged span is then in the file.

Memory: requests in flight are bounded (count and bytes, `Admission`), then the write queue
(``batcher.max_queue_bytes``), then DuckDB (``duckdb_memory_limit``). After a fatal DuckDB error the
writer reopens the store (`SpanWriter`); `health` says ``recovering`` / ``failed`` meanwhile.
"""

from __future__ import annotations

import logging
import threading

from typing import Any

from spanrl.collector.admission import Admission
from spanrl.collector.rewards import RewardCheck
from spanrl.collector.sender import RolloutClaims, SenderCheck
from spanrl import semconv
from spanrl.collector.batcher import Batcher, SpanWriter
from spanrl.collector.encoding import encode_request
from spanrl.collector.fast_decode import active_decoder, decode_body, fast_enabled
from spanrl.collector.config import CollectorConfig
from spanrl.collector.grpc import GrpcReceiver
from spanrl.collector.http import HttpReceiver, OtlpHttpApp
from spanrl.collector.materializer import Materializer
from spanrl.collector.retention import Retention
from spanrl.collector.sql import SqlRunner
from spanrl.errors import CollectorError, StoreError
from spanrl.http_server import url_host
from spanrl.lifecycle import Lifecycle, State
from spanrl.store import SpanStore

__all__ = ["Collector"]

_logger = logging.getLogger(__name__)


class Collector:
    """An in-process spanrl collector. ``start()`` binds; ``shutdown()`` flushes and closes."""

    def __init__(self, config: CollectorConfig | None = None, *, store: SpanStore | None = None) -> None:
        """``store``: write into an already open store (the collector then does not close it)."""
        self._config = config if config is not None else CollectorConfig()
        self._config.validate()
        self._given_store = store
        self._store: SpanStore | None = None
        self._batcher: Batcher | None = None
        self._writer: SpanWriter | None = None
        self._grpc: GrpcReceiver | None = None
        self._http: HttpReceiver | None = None
        self._sql: SqlRunner | None = None
        self._materializer: Materializer | None = None
        self._retention: Retention | None = None
        self.failed = threading.Event()
        """Set when the store failed and could not be reopened (``spanrl collector`` then exits 3)."""
        self._life = Lifecycle("collector", CollectorError)
        self._start_error: str | None = None  # the store could not be opened

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> "Collector":
        """Open the store and start both receivers. Raises `CollectorError` if a port cannot be bound."""
        self._life.begin()
        cfg = self._config
        try:
            self._store = self._given_store if self._given_store is not None else SpanStore.open(
                cfg.db_path,
                memory_limit=cfg.duckdb_memory_limit,
                checkpoint_threshold=cfg.duckdb_checkpoint_threshold,
                threads=cfg.duckdb_threads,
                sandboxed=True,
            )
            self._writer = SpanWriter(self._store, on_failed=lambda _: self.failed.set())
            self._batcher = Batcher(cfg.batcher, self._writer)
            self._batcher.start()
            _warm_up()
            if cfg.materialize_interval_s is not None:
                self._materializer = Materializer(self._store, interval_s=cfg.materialize_interval_s).start()
            retry_s = cfg.batcher.retry_after_s
            claims = RolloutClaims.load(self._store) if cfg.claim_rollouts else None
            # Every decoded batch, from either receiver and either decoder, passes each stage once: what its
            # sender may store, then its rewards (unusable ones rejected per span), then the batcher.
            checked = SenderCheck(cfg.tokens(), claims, RewardCheck(cfg.reward_range, self._batcher))
            if cfg.retention_s is not None:
                self._retention = Retention(self._store, retention_s=cfg.retention_s, claims=claims).start()
            # One byte budget for both receivers; a request count for each.
            inflight_bytes = Admission(max_requests=1, max_bytes=cfg.max_inflight_bytes, retry_after_s=retry_s)
            fast = fast_enabled()  # the decoder the start-up log names, for every request
            if cfg.grpc_port != -1:
                self._grpc = GrpcReceiver(
                    host=cfg.host,
                    port=cfg.grpc_port,
                    tokens=cfg.tokens(),
                    max_request_bytes=cfg.max_request_bytes,
                    max_concurrent_rpcs=cfg.grpc_max_concurrent_rpcs,
                    admission=inflight_bytes.with_request_cap(cfg.grpc_max_concurrent_rpcs),
                    next_consumer=checked,
                    fast_decoder=fast,
                    receive_timeout_s=cfg.grpc_receive_timeout_s,
                )
                self._grpc.start()
            if cfg.http_port != -1:
                self._sql = SqlRunner(self._store, workers=cfg.sql_workers, max_waiting=cfg.sql_max_waiting,
                                      timeout_s=cfg.sql_timeout_s, retry_after_s=retry_s, max_rows=cfg.sql_max_rows,
                                      max_bytes=cfg.sql_max_bytes)
                app = OtlpHttpApp(tokens=cfg.tokens(), bound_host=cfg.host, claims=claims,
                                  max_request_bytes=cfg.max_request_bytes, next_consumer=checked,
                                  store=self._store,
                                  admission=inflight_bytes.with_request_cap(cfg.http_max_concurrency),
                                  sql=self._sql, health=self.health, fast_decoder=fast)
                self._http = HttpReceiver(host=cfg.host, port=cfg.http_port, app=app,
                                          graceful_timeout_s=cfg.shutdown_timeout_s)
                self._http.start()
        except BaseException as exc:
            if isinstance(exc, StoreError):  # damaged file, full disk: /health says so, the CLI exits 1 with it
                self._start_error = str(exc)
                self.failed.set()
            self.shutdown()
            raise
        _logger.info("collector on grpc=%s http=%s db=%s; protobuf decoder: %s", self.grpc_endpoint, self.http_endpoint,
                     cfg.db_path, active_decoder())
        open_line = cfg.open_scopes()
        if open_line is not None:
            _logger.warning("%s", open_line)
        tokens = cfg.tokens()
        closed = [s for s in ("ingest", "policy", "read", "admin") if tokens.guarded(s) and not tokens.granted(s)]
        if closed:
            _logger.info("collector: no token grants the scopes %s, so they are closed to everyone (fail closed)%s",
                         ", ".join(closed), "; without a policy token no sender's token ids are kept"
                         if "policy" in closed else "")
        return self

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop receivers, commit everything accepted, close the store. Safe before start or twice."""
        if not self._life.end():
            return
        timeout = self._config.shutdown_timeout_s if timeout is None else timeout
        if self._grpc is not None:
            self._grpc.shutdown(timeout)
        if self._http is not None:
            self._http.shutdown(timeout)
        if self._sql is not None:
            self._sql.shutdown()
        if self._materializer is not None:
            self._materializer.shutdown(timeout)
        if self._retention is not None:
            self._retention.shutdown(timeout)
        if self._batcher is not None:
            self._batcher.shutdown(timeout)
        if self._writer is not None:
            self._writer.shutdown(timeout)
        if self._store is not None and self._given_store is None:
            self._store.close()

    def __enter__(self) -> "Collector":
        if self._life.state is State.NEW:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- what callers need -------------------------------------------------------------------------
    @property
    def config(self) -> CollectorConfig:
        """The validated config."""
        return self._config

    @property
    def store(self) -> SpanStore:
        """The span store this collector writes (shared connection; use `SpanStore.cursor` per thread)."""
        if self._store is None:
            raise CollectorError("Cannot use the store of a collector that was not started")
        return self._store

    @property
    def grpc_endpoint(self) -> str | None:
        """``HOST:PORT`` of OTLP/gRPC (the real port when 0 was asked), or None when off or not started."""
        if self._grpc is None or self._grpc.port is None:
            return None
        return f"{url_host(self._config.host)}:{self._grpc.port}"

    @property
    def http_endpoint(self) -> str | None:
        """``http://HOST:PORT`` of OTLP/HTTP and SQL, or None when off or not started."""
        if self._http is None or self._http.port is None:
            return None
        return f"http://{url_host(self._config.host)}:{self._http.port}"

    def health(self) -> dict[str, Any]:
        """``{"status": "ok"}``, or ``failing`` (the last commit failed: a full disk) / ``recovering`` / ``failed``
        with the writer's last ``error``."""
        if self._start_error is not None:
            return {"status": "failed", "error": self._start_error}
        writer = self._writer
        if writer is None or writer.state == "ok":
            return {"status": "ok"}
        return {"status": writer.state, "error": writer.last_error}

    @property
    def committed_spans(self) -> int:
        """Spans committed since start."""
        return 0 if self._batcher is None else self._batcher.committed_spans


def _warm_up() -> None:
    """Walk one span with token arrays before serving: the first walk initialises pyarrow and numpy
    lazily, and while a long SQL query ran that first walk waited for it (4 s in tests)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    span = spans.add(trace_id=b"\x01" * 16, span_id=b"\x01" * 8, name="warm-up")
    ids = AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1)]))
    span.attributes.extend([
        KeyValue(key=semconv.LLM_PROMPT_TOKEN_IDS, value=ids), KeyValue(key="k", value=AnyValue(string_value="v")),
    ])

    encode_request(request)
    decode_body(request.SerializeToString())  # the fast path's Arrow arrays from buffers, once


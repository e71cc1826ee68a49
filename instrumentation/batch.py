"""The agent's export span processor: a plain snapshot of each span as it ends, encoded in batches.

The SDK's ``BatchSpanProcessor`` queues the finished ``ReadableSpan`` objects (a dozen containers each:
the span, context, bounded attributes, events, links, status) for up to ``schedule_delay`` before its
thread encodes them. Objects that live that long survive the young garbage collections and are
promoted, and promoted objects are what trigger full collections: in an agent loop that cost more CPU
(about 30 us per LLM call, on the agent's own thread) than encoding the span. ``on_end`` here takes
``exporter.snapshot(span)`` (one tuple of plain values plus the span's frozen attribute dict, ~1 us);
the export thread encodes a batch of them in one tight loop (``encode_snapshot``: in C where the
extension is built, ~0.4 us a chat span, else ~4.5 us in Python: in Python about half the CPU of
encoding each span between two LLM calls, with the caches cold), joins them into one
``ExportTraceServiceRequest`` and sends it with ``FastOTLPSpanExporter.export_encoded`` (the SDK
exporter's retries, headers, TLS, deadline). The agent's thread does no encoding.

Same settings and behaviour as ``BatchSpanProcessor``: ``OTEL_BSP_SCHEDULE_DELAY`` / ``_MAX_QUEUE_SIZE``
/ ``_MAX_EXPORT_BATCH_SIZE`` / ``_EXPORT_TIMEOUT`` (or arguments), unsampled spans skipped, a full queue
drops new spans (counted, one warning), ``force_flush`` exports everything queued, a forked child starts
empty with its own thread. A request also stays under ``max_export_batch_bytes`` (default 3.5 MiB), so
a stock OpenTelemetry Collector (4 MiB receive limit) takes it.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from typing import Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.environment_variables import (
    OTEL_BSP_EXPORT_TIMEOUT,
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_SCHEDULE_DELAY,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import TraceFlags

from spanrl.errors import ConfigError
from spanrl.instrumentation.exporter import EncodedRequest, FastOTLPSpanExporter, assemble, encode_snapshot, snapshot

__all__ = ["BatchEncodingSpanProcessor", "export_span_processor"]

_logger = logging.getLogger(__name__)

# The SDK's defaults for the OTEL_BSP_* variables.
_DEFAULTS = {OTEL_BSP_SCHEDULE_DELAY: 5000, OTEL_BSP_MAX_QUEUE_SIZE: 2048, OTEL_BSP_MAX_EXPORT_BATCH_SIZE: 512,
             OTEL_BSP_EXPORT_TIMEOUT: 30000}
DEFAULT_MAX_EXPORT_BATCH_BYTES = 3584 * 1024


def _setting(value: int | None, variable: str) -> int:
    if value is not None:
        return value
    raw = os.environ.get(variable, "").strip()
    try:
        return int(raw) if raw else _DEFAULTS[variable]
    except ValueError:
        _logger.warning("%s=%r is not an integer; using %s", variable, raw, _DEFAULTS[variable])
        return _DEFAULTS[variable]


class BatchEncodingSpanProcessor(SpanProcessor):
    """``BatchSpanProcessor`` for ``FastOTLPSpanExporter`` that queues span snapshots, not spans."""

    def __init__(
        self,
        exporter: FastOTLPSpanExporter,
        max_queue_size: int | None = None,
        schedule_delay_millis: int | None = None,
        max_export_batch_size: int | None = None,
        export_timeout_millis: int | None = None,
        *,
        max_export_batch_bytes: int = DEFAULT_MAX_EXPORT_BATCH_BYTES,
    ) -> None:
        self.exporter = exporter
        self._max_queue_size = _setting(max_queue_size, OTEL_BSP_MAX_QUEUE_SIZE)
        self._schedule_delay_s = _setting(schedule_delay_millis, OTEL_BSP_SCHEDULE_DELAY) / 1000
        self._max_batch = _setting(max_export_batch_size, OTEL_BSP_MAX_EXPORT_BATCH_SIZE)
        self._export_timeout_millis = _setting(export_timeout_millis, OTEL_BSP_EXPORT_TIMEOUT)
        self._max_batch_bytes = max_export_batch_bytes
        for name, value in (("max_queue_size", self._max_queue_size),
                            ("schedule_delay_millis", self._schedule_delay_s * 1000),
                            ("max_export_batch_size", self._max_batch),
                            ("max_export_batch_bytes", max_export_batch_bytes)):
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {value!r}")
        if self._max_batch > self._max_queue_size:
            raise ConfigError(
                f"max_export_batch_size must be <= max_queue_size, got {self._max_batch} > {self._max_queue_size}"
            )

        self.dropped = 0
        self._shutdown = False
        self._start_worker()
        weak_restart = weakref.WeakMethod(self._start_worker)
        os.register_at_fork(after_in_child=lambda: (restart := weak_restart()) and restart())

    def _start_worker(self) -> None:
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name="SpanRLBatchSpanProcessor", daemon=True)
        self._worker.start()

    # --- the agent's thread ---------------------------------------------------------------------------

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        # trace_flags (a SpanContext is a tuple) & SAMPLED, without the three property calls
        context = span._context if type(span) is ReadableSpan else span.context
        if self._shutdown or not context[3] & TraceFlags.SAMPLED:
            return
        try:
            snap = snapshot(span)
        except Exception:  # telemetry never breaks the agent
            _logger.exception("spanrl could not read span %r; dropped", span.name)
            return
        self.enqueue(snap)

    def enqueue(self, snap: tuple[Any, ...]) -> None:
        """Queue a span ``snapshot`` for export (``on_end``, and ``_direct`` for spans it writes itself)."""
        if self._shutdown:
            return
        queue = self._queue
        if len(queue) >= self._max_queue_size:
            self.dropped += 1
            if self.dropped == 1:
                _logger.warning("spanrl: span queue full (%d); dropping spans until the collector catches up",
                                self._max_queue_size)
            return
        queue.append(snap)
        if len(queue) >= self._max_batch and not self._wake.is_set():
            self._wake.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export every span queued now, on this thread; False if that took longer than the timeout."""
        if self._shutdown:
            return False
        return self._export_all(time.monotonic() + timeout_millis / 1000)

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        self._wake.set()
        self._worker.join(self._export_timeout_millis / 1000)
        self.exporter.shutdown()

    # --- the export thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        # As the SDK's: woken by a full batch, send full batches only; after the delay, what is queued.
        # Never loop on partial batches: spans keep arriving, and each request costs ~0.4 ms of CPU.
        while not self._shutdown:
            full = self._wake.wait(self._schedule_delay_s)
            self._wake.clear()
            with self._export_lock:
                if full:
                    while len(self._queue) >= self._max_batch and not self._shutdown:
                        self._export_batch(self._max_batch)
                else:
                    self._export_queued(None)
        self._export_all(time.monotonic() + self._export_timeout_millis / 1000)

    def _export_all(self, deadline: float | None) -> bool:
        """Export the spans queued now (not those queued meanwhile); False on deadline."""
        with self._export_lock:
            return self._export_queued(deadline)

    def _export_queued(self, deadline: float | None) -> bool:
        left = len(self._queue)
        while left > 0:
            if deadline is not None and time.monotonic() > deadline:
                return False
            left -= self._export_batch(min(left, self._max_batch))
        return True

    def _export_batch(self, count: int) -> int:
        """Encode ``count`` queued spans (fewer if the queue is shorter); send them in requests under the
        byte cap. Returns how many were taken from the queue."""
        queue, items, size = self._queue, [], 0
        count = min(len(queue), count)
        for _ in range(count):
            snap = queue.popleft()
            try:
                item = encode_snapshot(snap)
            except Exception:
                _logger.exception("spanrl could not encode span %r; dropped", snap[7])
                continue
            if items and size + len(item[2]) > self._max_batch_bytes:
                self._send(items)
                items, size = [], 0
            items.append(item)
            size += len(item[2])
        if items:
            self._send(items)
        return count

    def _send(self, items: list[tuple[bytes, bytes, bytes]]) -> None:
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))  # the export's own gRPC call untraced
        try:
            self.exporter.export_encoded(EncodedRequest(assemble(items), len(items)))
        except Exception:
            _logger.exception("spanrl: exporting %d spans failed", len(items))
        finally:
            detach(token)


def export_span_processor(exporter: SpanExporter) -> SpanProcessor:
    """The processor for a configured exporter: ``BatchEncodingSpanProcessor`` for spanrl's own,
    the SDK's ``BatchSpanProcessor`` for any other (``export_span_processor`` of the SDK configurator)."""
    if isinstance(exporter, FastOTLPSpanExporter):
        return BatchEncodingSpanProcessor(exporter)
    return BatchSpanProcessor(exporter)

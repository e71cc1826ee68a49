"""The policy server's spans: one SERVER span per generated choice, exported over OTLP/gRPC.

The server has its own TracerProvider (never the global one), so embedding it in a process that is
itself instrumented changes nothing there. Token ids and logprobs go on the span either as plain
arrays or, compactly, as base64 of little-endian int32 / float32 (the codec: ``spanrl/codec.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from spanrl import semconv
from spanrl.codec import encode_float32, encode_int32

__all__ = ["SpanRecorder"]

_logger = logging.getLogger(__name__)

_EXPORT_DELAY_MILLIS = 200
_SCOPE_NAME = "spanrl.serving"


def _package_version() -> str | None:
    """The installed spanrl's version, read from its metadata (not ``spanrl.__version__``: the server imports
    nothing of the public API room above it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spanrl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return None


class SpanRecorder:
    """Creates the server's spans and exports them in the background."""

    def __init__(
        self,
        *,
        service_name: str,
        endpoint: str | None,
        headers: Mapping[str, str] | None = None,
        exporter: SpanExporter | None = None,
        compact: bool = True,
    ) -> None:
        self.compact = compact
        self._provider = TracerProvider(resource=Resource.create({semconv.SERVICE_NAME: service_name}))
        if exporter is None and endpoint:
            # the agents' encoder (the same request bytes' meaning): the SDK's builds a protobuf object per
            # attribute in Python, on the process that also runs generation (and, embedded, the collector)
            from spanrl.instrumentation.exporter import FastOTLPSpanExporter

            url = endpoint if "://" in endpoint else f"http://{endpoint}"
            exporter = FastOTLPSpanExporter(endpoint=url, insecure=url.startswith("http://"),
                                            headers=dict(headers or {}) or None)

        if exporter is not None:
            self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=_EXPORT_DELAY_MILLIS))
        self._tracer = self._provider.get_tracer(_SCOPE_NAME, _package_version())
        self._propagator = TraceContextTextMapPropagator()

    def parent_from_headers(self, headers: Mapping[str, str]) -> otel_context.Context:
        """The caller's W3C trace context (``traceparent``), or an empty context."""
        return self._propagator.extract(carrier=dict(headers))

    def tokens(self, ids: Sequence[int]) -> Any:
        """Token ids as a span attribute value."""
        return encode_int32(ids) if self.compact else list(ids)

    def floats(self, values: Sequence[float]) -> Any:
        """Logprobs as a span attribute value."""
        return encode_float32(values) if self.compact else [float(v) for v in values]

    def record(
        self,
        name: str,
        *,
        parent: otel_context.Context,
        start_ns: int,
        attributes: Mapping[str, Any],
        error: str | None = None,
    ) -> None:
        """Record one finished SERVER span that started at ``start_ns`` and ends now."""
        try:
            span = self._tracer.start_span(
                name, context=parent, kind=SpanKind.SERVER, start_time=start_ns, attributes=dict(attributes)
            )
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
            span.end()
        except Exception:  # telemetry must never fail a request
            _logger.exception("could not record the server span")

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every finished span now; True when all were exported in time."""
        return self._provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop the exporter."""
        self._provider.shutdown()

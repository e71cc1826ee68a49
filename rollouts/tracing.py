"""Tracing for in-process (callable) agents: their spans go to the running Trainer's collector."""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["InProcessTracing"]

_logger = logging.getLogger(__name__)

_IN_PROCESS_EXPORT_DELAY_MILLIS = 100


class InProcessTracing:
    """Spans of in-process (callable) agents go to the running Trainer's collector.

    The OTel provider is process-global and set once, but a process may run several Trainers (each with
    its own collector). So one batch processor is added to the global SDK provider (created if there is
    none) and its exporter forwards to whichever collector :meth:`point_at` names; None drops spans.
    The OpenAI client is instrumented (OpenLLMetry, then the ``spanrl`` instrumentor's adjustments: the
    rollout ``baggage`` header and the speedups) while a Trainer points here, as ``opentelemetry-instrument``
    would, and both are uninstrumented again by ``point_at(None)`` when the Trainer closes, so the process
    is left as it was found (an instrumentor the user turned on stays on).
    """

    _lock = threading.Lock()
    _exporter: Any = None  # the collector's OTLP exporter now, or None
    _installed = False
    _processor: Any = None  # the forwarding BatchSpanProcessor, once installed
    _we_instrumented_openai = False
    _we_instrumented_spanrl = False

    @classmethod
    def point_at(cls, endpoint: str | None, headers: dict[str, str] | None = None) -> None:
        """Send in-process spans to the collector at ``endpoint`` (OTLP/gRPC URL), with ``headers`` (its
        ingest token); None: drop them and turn off the instrumentation this class turned on."""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        from spanrl.instrumentation.inprocess import attach_rollout_processor
        from spanrl.instrumentation.exporter import FastOTLPSpanExporter

        with cls._lock:
            if not cls._installed:
                provider = trace.get_tracer_provider()
                if not isinstance(provider, TracerProvider):
                    provider = TracerProvider()
                    trace.set_tracer_provider(provider)
                    provider = trace.get_tracer_provider()
                attach_rollout_processor(provider)

                class Forward(SpanExporter):
                    def export(self, spans: Any) -> Any:
                        target = cls._exporter
                        return target.export(spans) if target is not None else SpanExportResult.SUCCESS

                    def force_flush(self, timeout_millis: int = 30_000) -> bool:
                        return True

                processor = BatchSpanProcessor(Forward(), schedule_delay_millis=_IN_PROCESS_EXPORT_DELAY_MILLIS)
                provider.add_span_processor(processor)  # type: ignore[attr-defined]
                cls._processor = processor
                cls._installed = True
            else:
                cls._processor.force_flush()  # what the previous run's agents produced goes to its collector
            cls._instrument_openai(endpoint is not None)
            new = FastOTLPSpanExporter(endpoint=endpoint, insecure=True, headers=headers) if endpoint else None
            old, cls._exporter = cls._exporter, new

            if old is not None:
                old.shutdown()

    @classmethod
    def _instrument_openai(cls, on: bool) -> None:
        try:
            from opentelemetry.instrumentation.openai import OpenAIInstrumentor
        except ImportError:  # pragma: no cover - the train extra installs it
            _logger.warning("opentelemetry-instrumentation-openai is missing: agent LLM calls are not traced")
            return
        from spanrl.instrumentation.instrumentor import SpanRLInstrumentor

        instrumentor, spanrl_instrumentor = OpenAIInstrumentor(), SpanRLInstrumentor()
        if on:
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument()
                cls._we_instrumented_openai = True
            if not spanrl_instrumentor.is_instrumented_by_opentelemetry:  # after OpenLLMetry: it adjusts it
                spanrl_instrumentor.instrument()
                cls._we_instrumented_spanrl = True
            return
        if cls._we_instrumented_spanrl:
            spanrl_instrumentor.uninstrument()
            cls._we_instrumented_spanrl = False
        if cls._we_instrumented_openai:
            from spanrl.instrumentation.inprocess import uninstrument_openai

            uninstrument_openai()
            cls._we_instrumented_openai = False

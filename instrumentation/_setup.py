"""Programmatic SDK setup for processes that do not run under ``opentelemetry-instrument``.

``configure()`` installs a ``TracerProvider`` (resource with the rollout ids from the environment,
``RolloutSpanProcessor``, ``BatchEncodingSpanProcessor`` + ``FastOTLPSpanExporter`` over OTLP/gRPC) as the
global provider, once.

Under ``opentelemetry-instrument`` (or any code that already set an SDK provider) it only makes sure
the rollout processor is attached and returns the existing provider.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from opentelemetry import trace

from spanrl.instrumentation._rollout import rollout_resource_attributes
from spanrl.instrumentation.config import InstrumentationConfig, apply_env_defaults

_logger = logging.getLogger(__name__)
_lock = threading.Lock()


def configure(
    endpoint: str | None = None,
    *,
    service_name: str | None = None,
    config: InstrumentationConfig | None = None,
) -> Any:
    """Set up tracing to a spanrl collector for this process (idempotent); return the TracerProvider.

    ``endpoint`` / ``service_name`` override the same fields of ``config``. Precedence: argument, then
    ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` / ``OTEL_SERVICE_NAME``, then ``http://127.0.0.1:4317`` /
    ``spanrl-agent``. Raises ``ConfigError`` for a bad config (setup code, not agent hot path).
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider

    from spanrl.instrumentation._processor import attach_rollout_processor
    from spanrl.instrumentation.batch import BatchEncodingSpanProcessor
    from spanrl.instrumentation.exporter import FastOTLPSpanExporter

    cfg = InstrumentationConfig(**vars(config)) if config is not None else InstrumentationConfig()
    if endpoint is not None:
        cfg.endpoint = endpoint
    if service_name is not None:
        cfg.service_name = service_name
    cfg.validate()
    with _lock:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            attach_rollout_processor(current)
            if getattr(current, "_spanrl_configured", None) not in (None, cfg.resolved_endpoint()):
                _logger.warning(
                    "spanrl.configure: tracing already set up for %s; endpoint %s ignored",
                    current._spanrl_configured,  # type: ignore[attr-defined]
                    cfg.resolved_endpoint(),
                )
            return current
        apply_env_defaults()  # message capture and length limit for instrumentors loaded later
        resource = Resource.create({**rollout_resource_attributes(), SERVICE_NAME: cfg.resolved_service_name()})
        provider = TracerProvider(resource=resource)
        attach_rollout_processor(provider)
        endpoint_url = cfg.resolved_endpoint()
        insecure = endpoint_url.startswith("http://")
        exporter = FastOTLPSpanExporter(
            endpoint=endpoint_url,
            insecure=insecure,
            headers=tuple(cfg.resolved_headers().items()) or None,
            timeout=cfg.export_timeout_millis / 1000,
        )
        provider.add_span_processor(
            BatchEncodingSpanProcessor(
                exporter,
                max_queue_size=cfg.max_queue_size,
                schedule_delay_millis=cfg.schedule_delay_millis,
                max_export_batch_size=cfg.max_export_batch_size,
                export_timeout_millis=cfg.export_timeout_millis,
            )
        )
        provider._spanrl_configured = endpoint_url  # type: ignore[attr-defined]
        trace.set_tracer_provider(provider)
        _logger.debug("spanrl tracing to %s", endpoint_url)
        return provider


def flush(timeout_s: float = 10.0) -> bool:
    """Export every finished span now (e.g. at the end of a rollout); False on timeout or no SDK."""
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is None:
        return False
    try:
        return bool(force_flush(int(timeout_s * 1000)))
    except Exception:
        _logger.exception("spanrl.flush failed")
        return False

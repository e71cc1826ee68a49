"""``opentelemetry_configurator`` entry point ``spanrl``: the SDK setup under ``opentelemetry-instrument``.

The standard SDK setup plus: the rollout ids from ``SPANRL_*`` variables as resource attributes, the
``RolloutSpanProcessor`` (ids from ``spanrl.rollout`` baggage onto spans), and spanrl's exporter behind
``BatchEncodingSpanProcessor`` (``batch.py``) instead of the SDK's ``BatchSpanProcessor``. It applies spanrl's
defaults too, so it works whichever distro was loaded. Beside ``opentelemetry-distro`` pick it with
``OTEL_PYTHON_CONFIGURATOR=spanrl``; without it the ``spanrl`` instrumentor still attaches the rollout
context (as span attributes instead of resource attributes).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk._configuration import _OTelSDKConfigurator

from spanrl.instrumentation._processor import RolloutSpanProcessor, attach_rollout_processor
from spanrl.instrumentation._rollout import rollout_resource_attributes
from spanrl.instrumentation.batch import export_span_processor
from spanrl.instrumentation.config import apply_env_defaults


class SpanRLConfigurator(_OTelSDKConfigurator):
    """OTel SDK configurator with spanrl's resource attributes and rollout span processor."""

    def _configure(self, **kwargs: Any) -> None:
        from opentelemetry import trace

        apply_env_defaults()
        kwargs["resource_attributes"] = {**rollout_resource_attributes(), **(kwargs.get("resource_attributes") or {})}
        processor = RolloutSpanProcessor()  # the resource carries the env ids; baggage only
        kwargs["span_processors"] = [processor, *(kwargs.get("span_processors") or [])]
        kwargs.setdefault("export_span_processor", export_span_processor)  # spans encoded as they end
        super()._configure(**kwargs)
        provider = trace.get_tracer_provider()
        if hasattr(provider, "add_span_processor"):
            provider._spanrl_rollout_processor = processor  # type: ignore[attr-defined]
        else:  # OTEL_SDK_DISABLED or a declarative config: nothing to attach to
            attach_rollout_processor(provider)

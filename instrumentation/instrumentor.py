"""``opentelemetry_instrumentor`` entry point ``spanrl``: attaches the rollout context.

Loaded by ``opentelemetry-instrument`` after the configurator, whichever configurator it was:

* attaches ``RolloutSpanProcessor`` to the global SDK provider if the spanrl configurator did not
  (then the ``SPANRL_*`` ids are stamped on each span, since the resource lacks them);
* makes OpenLLMetry's OpenAI instrumentation send the W3C ``baggage`` header beside ``traceparent``,
  so requests made inside ``spanrl.rollout`` carry the rollout ids to the server.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Collection
from typing import Any

from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

_logger = logging.getLogger(__name__)

# Modules of opentelemetry-instrumentation-openai that call `propagate_trace_context(span, kwargs)`.
_OPENLLMETRY_MODULES = (
    "opentelemetry.instrumentation.openai.shared.chat_wrappers",
    "opentelemetry.instrumentation.openai.shared.completion_wrappers",
    "opentelemetry.instrumentation.openai.shared.embeddings_wrappers",
)
_HOOK = "propagate_trace_context"
_baggage = W3CBaggagePropagator()


def _with_baggage(original: Any) -> Any:
    def propagate_trace_context(span: Any, kwargs: dict[str, Any]) -> None:
        original(span, kwargs)
        try:
            key = "extra_headers" if "extra_headers" in kwargs else "headers"
            headers = kwargs.get(key)
            if isinstance(headers, dict):
                _baggage.inject(headers)
        except Exception:
            _logger.exception("spanrl could not add the baggage header")

    propagate_trace_context.__wrapped__ = original  # type: ignore[attr-defined]
    propagate_trace_context._spanrl = True  # type: ignore[attr-defined]
    return propagate_trace_context


class SpanRLInstrumentor(BaseInstrumentor):
    """Rollout context for every span and for outgoing OpenAI requests."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        from spanrl.instrumentation._processor import attach_rollout_processor

        if attach_rollout_processor(trace.get_tracer_provider()) is None:
            _logger.debug("spanrl instrumentor: no SDK tracer provider; rollout context not attached")
        for name in _OPENLLMETRY_MODULES:
            try:
                module = importlib.import_module(name)
            except Exception:  # OpenLLMetry missing or incompatible: nothing to patch
                continue
            hook = getattr(module, _HOOK, None)
            if hook is not None and not getattr(hook, "_spanrl", False):
                setattr(module, _HOOK, _with_baggage(hook))

    def _uninstrument(self, **kwargs: Any) -> None:
        processor = getattr(trace.get_tracer_provider(), "_spanrl_rollout_processor", None)
        if processor is not None:
            processor.enabled = False
        for name in _OPENLLMETRY_MODULES:
            module = importlib.sys.modules.get(name)  # type: ignore[attr-defined]
            hook = getattr(module, _HOOK, None) if module else None
            if hook is not None and getattr(hook, "_spanrl", False):
                setattr(module, _HOOK, hook.__wrapped__)

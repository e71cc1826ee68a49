"""``opentelemetry_instrumentor`` entry point ``spanrl``: attaches the rollout context.

Loaded by ``opentelemetry-instrument`` after the configurator, whichever configurator it was:

* attaches ``RolloutSpanProcessor`` to the global SDK provider if the spanrl configurator did not
  (then the ``SPANRL_*`` ids are stamped on each span, since the resource lacks them);
* under ``SPANRL_CAPTURE=lean`` (no OpenAI instrumentor loaded), puts ``traceparent`` and ``baggage`` on
  every ``openai`` request itself (``_propagate.py``);
* adjusts OpenLLMetry's OpenAI instrumentation (``_openllmetry.py``): the W3C ``baggage`` header beside
  ``traceparent``, so requests made inside ``spanrl.rollout`` carry the rollout ids, and two speedups.

Outside ``opentelemetry-instrument``: ``SpanRLInstrumentor().instrument()`` after ``configure()``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from spanrl.instrumentation import _openllmetry, _propagate
from spanrl.instrumentation.config import capture_profile

_logger = logging.getLogger(__name__)


class SpanRLInstrumentor(BaseInstrumentor):
    """Rollout context for every span and for outgoing OpenAI requests."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        from spanrl.instrumentation._processor import attach_rollout_processor

        if attach_rollout_processor(trace.get_tracer_provider()) is None:
            _logger.debug("spanrl instrumentor: no SDK tracer provider; rollout context not attached")
        _openllmetry.patch()
        if capture_profile() == "lean":
            _propagate.patch()

    def _uninstrument(self, **kwargs: Any) -> None:
        processor = getattr(trace.get_tracer_provider(), "_spanrl_rollout_processor", None)
        if processor is not None:
            processor.enabled = False
        _openllmetry.unpatch()
        _propagate.unpatch()

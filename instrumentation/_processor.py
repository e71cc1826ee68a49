"""The span processor that puts rollout ids on spans (needs the OTel SDK; emit code does not import it)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context
from opentelemetry.baggage import _BAGGAGE_KEY  # private; the API is pinned to one minor version
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk.trace import SpanProcessor

from spanrl import semconv
from spanrl.instrumentation._rollout import ROLLOUT_KEYS, parse_attempt, rollout_resource_attributes

_logger = logging.getLogger(__name__)
_MARK = "_spanrl_rollout_processor"


def _context_reader() -> Callable[[], context.Context]:
    """``context.get_current``, or where the runtime context is the API's default (a ContextVar) that
    variable's own ``get``: the same Context without two Python calls."""
    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    if type(runtime) is ContextVarsRuntimeContext:
        return runtime._current_context.get
    return context.get_current


current_context = _context_reader()


class RolloutSpanProcessor(SpanProcessor):
    """Copies rollout ids from baggage (set by ``spanrl.rollout``) onto each span as it starts.

    ``fallback`` attributes (the environment's ids) are stamped where baggage has none, for providers
    whose resource was built without them (another configurator chose the resource). Cost: one baggage
    lookup per span. ``enabled`` is switched off by ``SpanRLInstrumentor.uninstrument()``.
    """

    def __init__(self, fallback: Mapping[str, str | int] | None = None) -> None:
        self.fallback = dict(fallback or {})
        self.enabled = True

    def on_start(self, span: Any, parent_context: context.Context | None = None) -> None:
        if not self.enabled:
            return
        try:
            ctx = current_context() if parent_context is None else parent_context
            if self.fallback or ctx.get(_BAGGAGE_KEY):  # most spans: neither, nothing to stamp (no ids() call)
                for key, value in self.ids(ctx):
                    span.set_attribute(key, value)
        except Exception:  # telemetry never breaks the agent
            _logger.exception("spanrl could not stamp rollout ids on a span")

    def ids(self, parent_context: context.Context | None = None) -> list[tuple[str, Any]]:
        """The (key, value) pairs ``on_start`` stamps on a span started in ``parent_context``, in order."""
        # as baggage.get_all(parent_context) reads it, without its two calls (most spans: no baggage)
        entries = (current_context() if parent_context is None else parent_context).get(_BAGGAGE_KEY)
        if not isinstance(entries, dict):
            entries = {}
        if not entries and not self.fallback:
            return []
        out = []
        for key in ROLLOUT_KEYS:
            value: Any = entries.get(key)
            if value is None:
                value = self.fallback.get(key)
                if value is None:
                    continue
            elif key == semconv.ATTEMPT:
                value = parse_attempt(str(value), key)
                if value is None:
                    continue
            else:
                value = str(value)
            out.append((key, value))
        return out


def attach_rollout_processor(provider: Any) -> RolloutSpanProcessor | None:
    """Add a ``RolloutSpanProcessor`` to an SDK ``TracerProvider`` once and return it.

    Returns None when ``provider`` is not an SDK provider (no SDK configured: nothing to attach to).
    The environment's ids are stamped on spans only when the provider's resource lacks them.
    """
    existing = getattr(provider, _MARK, None)
    if existing is not None:
        existing.enabled = True
        return existing
    if not hasattr(provider, "add_span_processor"):
        return None
    resource_attrs = getattr(getattr(provider, "resource", None), "attributes", None) or {}
    fallback = {k: v for k, v in rollout_resource_attributes().items() if k not in resource_attrs}
    processor = RolloutSpanProcessor(fallback)
    provider.add_span_processor(processor)
    setattr(provider, _MARK, processor)
    return processor

"""Instant spans (rewards) written straight into spanrl's export queue, skipping the SDK span object.

A reward span has no duration, no events, no children: the SDK's span (sampler call, id objects,
``BoundedAttributes`` with its lock, the processor chain twice, ``ReadableSpan`` snapshot) costs several
times what its export needs. Where the global provider is exactly what spanrl's configurator builds
(an SDK ``TracerProvider`` whose processors are ``RolloutSpanProcessor`` and one
``BatchEncodingSpanProcessor``, the default parent-based always-on sampler, no SDK self-metrics, no
attribute length limit the values could reach), nothing but that queue would see the span, so
``emit_instant`` builds the span's ``exporter.snapshot`` tuple itself: the same ids, parent, trace state,
attributes (the rollout ids after the span's own, as ``on_start`` stamps them), resource and scope. Any
other setup (a processor of the user's, a custom sampler, tests' in-memory exporters) returns False and
the caller makes a normal SDK span.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry import context, trace
from opentelemetry.sdk.trace import Tracer, TracerProvider, sampling
from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor

from spanrl.instrumentation._processor import RolloutSpanProcessor
from spanrl.instrumentation._rollout import tracer
from spanrl.instrumentation.batch import BatchEncodingSpanProcessor
from spanrl.instrumentation.exporter import span_group

__all__ = ["emit_instant"]

_logger = logging.getLogger(__name__)
_KIND_INTERNAL = 0  # SpanKind.INTERNAL's value
_MIN_ATTRIBUTES = 16  # a reward's own attributes and the rollout ids fit under any such limit


class _Route:
    """Where instant spans go for one provider and processor tuple (None fields: no direct route)."""

    __slots__ = ("provider", "processors", "tracer", "batch", "rollout", "group", "ids", "max_length")

    def __init__(self, provider: Any, processors: Any) -> None:
        self.provider, self.processors = provider, processors
        self.tracer: Tracer | None = None
        self.batch: BatchEncodingSpanProcessor | None = None
        self.rollout: RolloutSpanProcessor | None = None
        self.group: tuple[bytes, bytes] = (b"", b"")
        self.ids: Any = None
        self.max_length: int | None = None


_route: _Route | None = None


def _default_sampler(sampler: Any) -> bool:
    if sampler is sampling.DEFAULT_ON:
        return True
    on, off = sampling.ALWAYS_ON, sampling.ALWAYS_OFF
    return (type(sampler) is sampling.ParentBased and sampler._root is on and sampler._remote_parent_sampled is on
            and sampler._local_parent_sampled is on and sampler._remote_parent_not_sampled is off
            and sampler._local_parent_not_sampled is off)


def _build(provider: Any, processors: Any) -> _Route:
    route = _Route(provider, processors)
    if (type(provider) is not TracerProvider or getattr(provider, "_disabled", True)
            or getattr(provider, "_meter_provider", None) is not None
            or provider._span_limits.max_span_attributes < _MIN_ATTRIBUTES):
        return route
    batches = [p for p in processors if type(p) is BatchEncodingSpanProcessor]
    rollouts = [p for p in processors if type(p) is RolloutSpanProcessor]
    if len(batches) != 1 or len(rollouts) > 1 or len(batches) + len(rollouts) != len(processors):
        return route
    real: Any = tracer()
    if isinstance(real, trace.ProxyTracer):  # made before the SDK was configured: the tracer it follows
        real = real._tracer
    if type(real) is not Tracer or real.resource is not provider.resource or not _default_sampler(real.sampler):
        return route
    route.tracer, route.batch, route.rollout = real, batches[0], rollouts[0] if rollouts else None
    route.group = span_group(real.resource, real._instrumentation_scope or None)
    route.ids = provider.id_generator
    route.max_length = provider._span_limits.max_span_attribute_length
    return route


def _current_route() -> _Route:
    global _route
    provider = trace.get_tracer_provider()
    active = getattr(provider, "_active_span_processor", None)
    processors = getattr(active, "_span_processors", None) if type(active) is SynchronousMultiSpanProcessor else None
    route = _route
    if route is None or route.provider is not provider or route.processors is not processors:
        try:
            route = _build(provider, processors or ())
        except Exception:  # an SDK whose internals differ: SDK spans, as without this module
            _logger.debug("spanrl: no direct route for instant spans", exc_info=True)
            route = _Route(provider, processors)
        _route = route
    return route


def emit_instant(name: str, attributes: dict[str, Any]) -> bool:
    """Queue an instant INTERNAL span ``name`` (child of the current span) with ``attributes`` (str and
    finite float values) for export; False when the setup needs a normal SDK span instead."""
    route = _current_route()
    batch, real = route.batch, route.tracer
    if batch is None or real is None or not real._is_enabled():
        return False
    limit = route.max_length
    if limit is not None and any(type(v) is str and len(v) > limit for v in attributes.values()):
        return False
    ctx = context.get_current()
    parent = trace.get_current_span(ctx).get_span_context()
    if parent.is_valid:
        if not parent.trace_flags.sampled:
            return True  # the SDK would make a non-recording span: nothing to export
        trace_id, parent_id, remote, state = parent.trace_id, parent.span_id, parent.is_remote, parent.trace_state
        trace_state = ",".join(f"{k}={v}" for k, v in state.items()) if state else None
    else:
        trace_id, parent_id, remote, trace_state = route.ids.generate_trace_id(), None, False, None
    span_id = route.ids.generate_span_id()
    rollout = route.rollout
    if rollout is not None and rollout.enabled:
        for key, value in rollout.ids(ctx):
            attributes[key] = value
    now = time.time_ns()
    batch.enqueue((*route.group, trace_id, span_id, trace_state, parent_id, remote, name, _KIND_INTERNAL, now, now,
                   None, None, 0, None, 0, 0, 0, *attributes, *attributes.values()))
    return True

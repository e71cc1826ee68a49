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
import random
from collections.abc import Callable
from time import time_ns
from typing import Any

from opentelemetry import trace
from opentelemetry.baggage import _BAGGAGE_KEY  # private, as _SPAN_KEY and the SDK's _Span:
from opentelemetry.sdk.trace import _Span as _SdkSpan  # the API and SDK are pinned to one minor version
from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor, Tracer, TracerProvider, sampling
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace.propagation import _SPAN_KEY

from spanrl.instrumentation._processor import RolloutSpanProcessor, current_context
from spanrl.instrumentation._rollout import tracer
from spanrl.instrumentation.batch import BatchEncodingSpanProcessor
from spanrl.instrumentation.exporter import span_group, trace_state_text

__all__ = ["emit_instant"]

_logger = logging.getLogger(__name__)
_KIND_INTERNAL = 0  # SpanKind.INTERNAL's value
_MIN_ATTRIBUTES = 16  # a reward's own attributes and the rollout ids fit under any such limit


class _Route:
    """Where instant spans go for one provider and processor tuple (None fields: no direct route)."""

    __slots__ = ("provider", "active", "processors", "tracer", "batch", "rollout", "group", "ids", "random_bits",
                 "max_length")

    def __init__(self, provider: Any, active: Any, processors: Any) -> None:
        self.provider, self.active, self.processors = provider, active, processors
        self.tracer: Tracer | None = None
        self.batch: BatchEncodingSpanProcessor | None = None
        self.rollout: RolloutSpanProcessor | None = None
        self.group: tuple[bytes, bytes] = (b"", b"")
        self.ids: Any = None
        self.random_bits: Callable[[int], int] | None = None  # what the SDK's RandomIdGenerator calls
        self.max_length: int | None = None


_route: _Route | None = None  # the last one used
_routes: dict[tuple[int, int], _Route] = {}
_MAX_ROUTES = 4


def _default_sampler(sampler: Any) -> bool:
    if sampler is sampling.DEFAULT_ON:
        return True
    on, off = sampling.ALWAYS_ON, sampling.ALWAYS_OFF
    return (type(sampler) is sampling.ParentBased and sampler._root is on and sampler._remote_parent_sampled is on
            and sampler._local_parent_sampled is on and sampler._remote_parent_not_sampled is off
            and sampler._local_parent_not_sampled is off)


def _build(provider: Any, active: Any, processors: Any) -> _Route:
    route = _Route(provider, active, processors)
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
    route.random_bits = random.getrandbits if type(route.ids) is RandomIdGenerator else None
    route.max_length = provider._span_limits.max_span_attribute_length
    return route


def _switch_route(provider: Any) -> _Route:
    """The route for the provider's processors now, built once per (provider, processor tuple): a provider
    whose processors change and change back (tests; the tracer bench's stages, call by call) finds its
    route again instead of rebuilding it."""
    global _route
    active = getattr(provider, "_active_span_processor", None)
    if type(active) is not SynchronousMultiSpanProcessor:
        active = None
    processors = getattr(active, "_span_processors", None)
    key = (id(provider), id(processors))
    route = _routes.get(key)
    if route is None or route.provider is not provider or route.processors is not processors:
        try:
            route = _build(provider, active, processors or ())
        except Exception:  # an SDK whose internals differ: SDK spans, as without this module
            _logger.debug("spanrl: no direct route for instant spans", exc_info=True)
            route = _Route(provider, active, processors)  # rebuilt when the processors change
        if len(_routes) >= _MAX_ROUTES:
            _routes.clear()
        _routes[key] = route  # it holds the provider and the tuple: their ids are not reused while kept
    _route = route
    return route


def emit_instant(name: str, keys: tuple[str, ...], values: tuple[Any, ...]) -> bool:
    """Queue an instant INTERNAL span ``name`` (child of the current span) with the attributes ``keys`` =
    ``values`` (str and finite float values) for export; False when the setup needs a normal SDK span.

    It runs once per reward between two LLM calls, with the CPU's caches cold, where each Python call and
    ABC check it makes costs about a microsecond: one function; the SDK's own span's context read directly.
    """
    route, provider = _route, trace.get_tracer_provider()
    if (route is None or route.provider is not provider
            or (route.active is not None and route.active._span_processors is not route.processors)):
        route = _switch_route(provider)
    batch, real = route.batch, route.tracer
    if batch is None or real is None or not real._tracer_config.is_enabled:  # as Tracer._is_enabled()
        return False
    ctx = current_context()
    current = ctx.get(_SPAN_KEY)  # as trace.get_current_span(ctx), without its calls
    if type(current) is _SdkSpan:
        parent = current._context
    elif current is not None and isinstance(current, trace.Span):
        parent = current.get_span_context()
    else:
        parent = trace.INVALID_SPAN_CONTEXT
    # SpanContext is a tuple: its fields unpacked at once, not through six properties
    trace_id, parent_id, remote, flags, state, valid = parent
    if valid:
        if not flags & trace.TraceFlags.SAMPLED:
            return True  # the SDK would make a non-recording span: nothing to export
        state = trace_state_text(state)
    else:
        trace_id, parent_id, remote, state = route.ids.generate_trace_id(), None, False, None
    bits = route.random_bits
    span_id = bits(64) if bits is not None else 0
    if not span_id:  # another id generator, or the one draw in 2**64 that is the invalid id
        span_id = route.ids.generate_span_id()
    rollout = route.rollout  # its ids after the span's own attributes, as on_start stamps them
    if rollout is not None and rollout.enabled and (rollout.fallback or ctx.get(_BAGGAGE_KEY)):
        pairs = rollout.ids(ctx)
        keys, values = keys + tuple(k for k, _ in pairs), values + tuple(v for _, v in pairs)
    limit = route.max_length  # a value the SDK would truncate: its span, not this one
    if limit is not None:  # a loop, not any(generator): no generator object to make
        for value in values:
            if type(value) is str and len(value) > limit:
                return False
    now = time_ns()
    batch.enqueue((*route.group, trace_id, span_id, state, parent_id, remote, name, _KIND_INTERNAL, now, now,
                   None, None, 0, None, 0, 0, 0, *keys, *values))
    return True

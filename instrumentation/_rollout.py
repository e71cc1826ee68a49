"""Rollout context: which rollout a span belongs to.

Two ways, one vocabulary (``semconv.ROLLOUT_ID`` ...):

* an agent process started by the trainer gets ``SPANRL_ROLLOUT_ID`` / ``SPANRL_TASK_ID`` /
  ``SPANRL_ATTEMPT`` / ``SPANRL_MODE``; they become resource attributes (``rollout_resource_attributes``);
* a long-lived agent serving many rollouts wraps each in ``spanrl.rollout(rollout_id=..., task_id=...)``,
  which opens the rollout's root span and puts the ids in W3C baggage; ``RolloutSpanProcessor`` copies
  them onto every span started below, and outgoing HTTP carries them in the ``baggage`` header.

The store takes the span attribute first, then the resource attribute.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from opentelemetry import baggage, context, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from spanrl import env
from spanrl import semconv

_logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
_TRACER_NAME = "spanrl.instrumentation"
ROLLOUT_KEYS = (semconv.ROLLOUT_ID, semconv.TASK_ID, semconv.ATTEMPT, semconv.MODE)
_DEFAULT_MODE = "train"


_tracer: trace.Tracer | None = None


def tracer() -> trace.Tracer:
    """spanrl's tracer on the global provider (a proxy that follows the SDK once one is configured)."""
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer(_TRACER_NAME)
    return _tracer


def parse_attempt(raw: str | None, source: str) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        _logger.warning("%s=%r is not an integer; attempt left unset", source, raw)
        return None


def rollout_resource_attributes() -> dict[str, str | int]:
    """Resource attributes from ``SPANRL_ROLLOUT_ID`` / ``_TASK_ID`` / ``_ATTEMPT`` / ``_MODE`` (unset: none)."""
    attrs: dict[str, str | int] = {}
    rollout_id = env.get_str(env.SPANRL_ROLLOUT_ID)
    if rollout_id:
        attrs[semconv.ROLLOUT_ID] = rollout_id
    task_id = env.get_str(env.SPANRL_TASK_ID)
    if task_id:
        attrs[semconv.TASK_ID] = task_id
    attempt = parse_attempt(env.get_str(env.SPANRL_ATTEMPT), env.SPANRL_ATTEMPT)
    if attempt is not None:
        attrs[semconv.ATTEMPT] = attempt
    mode = env.get_str(env.SPANRL_MODE)
    if mode or rollout_id:
        attrs[semconv.MODE] = mode or _DEFAULT_MODE
    return attrs


def current_rollout() -> dict[str, str | int]:
    """The rollout ids in effect here: baggage from ``rollout()``, else the environment."""
    entries = baggage.get_all()
    found: dict[str, str | int] = {}
    for key in ROLLOUT_KEYS:
        value = entries.get(key)
        if value is not None:
            parsed = parse_attempt(str(value), key) if key == semconv.ATTEMPT else str(value)
            found[key] = parsed  # type: ignore[assignment]

    return found or rollout_resource_attributes()


class rollout:  # noqa: N801 - used like a function: `with spanrl.rollout(...)` / `@spanrl.rollout(...)`
    """Run code as one rollout: opens the rollout's root span and puts its ids in baggage.

    Context manager and decorator (sync and async functions; each call is its own rollout span)::

        with spanrl.rollout(rollout_id="r-17", task_id="t-3"):
            run_agent(task)

    Spans started inside (LLM calls, tools, rewards) carry ``spanrl.rollout.id`` and friends, and HTTP
    requests made by instrumented clients carry them in the W3C ``baggage`` header. ``root=False`` nests
    the rollout span under the current span instead of starting a new trace. Telemetry failures are
    logged, never raised; the code's own exception passes through unchanged (the span records it).
    """

    def __init__(
        self,
        rollout_id: str,
        *,
        task_id: str | None = None,
        attempt: int | None = None,
        mode: str | None = None,
        root: bool = True,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        self.rollout_id = rollout_id
        self.task_id = task_id
        self.attempt = attempt
        self.mode = mode
        self.root = root
        self.attributes = dict(attributes or {})
        self._stack: list[tuple[Span | None, object | None]] = []

    def _ids(self) -> dict[str, str | int]:
        ids: dict[str, str | int] = {}
        if not isinstance(self.rollout_id, str) or not self.rollout_id:
            _logger.warning("spanrl.rollout: rollout_id must be a non-empty string, got %r", self.rollout_id)
        else:
            ids[semconv.ROLLOUT_ID] = self.rollout_id
        if self.task_id is not None:
            ids[semconv.TASK_ID] = str(self.task_id)
        if self.attempt is not None:
            if isinstance(self.attempt, int) and not isinstance(self.attempt, bool):
                ids[semconv.ATTEMPT] = self.attempt
            else:
                _logger.warning("spanrl.rollout: attempt must be an int, got %r", self.attempt)
        if self.mode is not None:
            ids[semconv.MODE] = str(self.mode)
        return ids

    def __enter__(self) -> Span:
        span: Span | None = None
        token: object | None = None
        try:
            ids = self._ids()
            ctx = context.get_current()
            for key, value in ids.items():
                ctx = baggage.set_baggage(key, str(value), context=ctx)
            parent = trace.set_span_in_context(trace.INVALID_SPAN, ctx) if self.root else ctx
            span = tracer().start_span(
                semconv.ROLLOUT_SPAN_NAME,
                context=parent,
                kind=SpanKind.INTERNAL,
                attributes={**self.attributes, **ids},
            )
            token = context.attach(trace.set_span_in_context(span, ctx))
        except Exception:
            _logger.exception("spanrl.rollout could not open the rollout span")
        self._stack.append((span, token))
        return span if span is not None else trace.INVALID_SPAN

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        span, token = self._stack.pop()
        _close(span, token, exc)

    def __call__(self, func: F) -> F:
        return _decorate(func, self._fresh)

    def _fresh(self) -> rollout:
        return rollout(
            self.rollout_id,
            task_id=self.task_id,
            attempt=self.attempt,
            mode=self.mode,
            root=self.root,
            attributes=self.attributes,
        )


def _close(span: Span | None, token: object | None, exc: BaseException | None) -> None:
    """End a scope's span (recording the user's exception) and detach its context; never raises."""
    try:
        if span is not None:
            if exc is not None:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.end()
    except Exception:
        _logger.exception("spanrl could not end span")
    if token is not None:
        try:
            context.detach(token)  # type: ignore[arg-type]
        except Exception:
            _logger.exception("spanrl could not restore the context")


def _decorate(func: F, make_scope: Callable[[], Any]) -> F:
    """Wrap ``func`` (sync or async) so each call runs inside a fresh scope from ``make_scope``."""
    if asyncio.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with make_scope():
                return await func(*args, **kwargs)

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with make_scope():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]

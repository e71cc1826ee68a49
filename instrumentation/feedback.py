"""``emit_feedback``: a reward for a rollout that already ended, sent later from any process.

In production the reward often comes from elsewhere and late: a user's thumbs-up minutes after the
answer, a ticket closed the next day, a batch judge. ``emit_feedback`` writes it in the OpenTelemetry
GenAI form: a ``gen_ai.evaluation.result`` event (``gen_ai.evaluation.name``,
``gen_ai.evaluation.score.value``, ``gen_ai.evaluation.explanation``) on one ``spanrl.feedback`` span (a
root span in a trace of its own, so it never inherits the rollout of whatever code calls it), with
exactly one key naming what it judges:

* ``response_id``: the ``id`` of one completion the rollout received (``gen_ai.response.id``, on the event
  and the span: the standard key, which any OTel program can send without spanrl);
* ``rollout_id``: the rollout (``spanrl.rollout.id`` on the span, so every view sees it at once);
* ``trace_id``: a trace of the rollout (``spanrl.feedback.trace_id``, 32 hex characters).

Like the rest of the emit API it imports no torch, does nothing without an OTel SDK (it says so once, as a
warning naming ``configure()``) and never raises: a bad value or key is logged and the span carries
``spanrl.emit.error`` and no event, so it trains nothing.
Several feedbacks for one rollout combine by the rule in ``docs/conventions.md`` (the latest wins).
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any

from opentelemetry import context
from opentelemetry.trace import SpanKind, Status, StatusCode

from spanrl import semconv
from spanrl.instrumentation._rollout import tracer

__all__ = ["emit_feedback"]

_logger = logging.getLogger("spanrl.instrumentation")
_HEX = frozenset("0123456789abcdef")
_TRACE_ID_HEX_CHARS = 32


def _trace_id_hex(value: Any) -> str | None:
    """A trace id as 32 lowercase hex characters (from hex text or an int), or None when invalid."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 128:
        return f"{value:032x}"
    if isinstance(value, str):
        text = value.strip().lower()
        if len(text) == _TRACE_ID_HEX_CHARS and set(text) <= _HEX and text.strip("0"):
            return text
    return None


_warned_no_sdk = False


def _warn_no_sdk() -> None:
    """Once per process: feedback from a process without an OTel SDK goes nowhere, which must not be silent."""
    global _warned_no_sdk
    if not _warned_no_sdk:
        _warned_no_sdk = True
        _logger.warning("spanrl: emit_feedback: no OpenTelemetry SDK in this process, so the feedback is not sent; "
                        "call spanrl.instrumentation.configure() first and spanrl.instrumentation.flush() before "
                        "exiting, or run under opentelemetry-instrument")


def _problem(value: Any, keys: dict[str, Any]) -> str | None:
    """What is wrong with the arguments, or None."""
    given = [name for name, key in keys.items() if key is not None]
    if len(given) != 1:
        return (f"emit_feedback needs exactly one of rollout_id, response_id, trace_id; "
                f"got {', '.join(given) if given else 'none'}")
    name = given[0]
    key = keys[name]
    if name == "trace_id":
        if _trace_id_hex(key) is None:
            return f"emit_feedback: trace_id must be 32 hex characters (or a non-zero 128-bit int), got {key!r}"
    elif not isinstance(key, str) or not key:
        return f"emit_feedback: {name} must be a non-empty string, got {key!r}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        return f"emit_feedback: value must be a finite number, got {value!r} ({type(value).__name__})"
    return None


def emit_feedback(
    value: float,
    *,
    rollout_id: str | None = None,
    response_id: str | None = None,
    trace_id: str | int | None = None,
    name: str | None = None,
    explanation: str | None = None,
) -> None:
    """Record late feedback (a reward) for a finished rollout, keyed by exactly one id.

    ``value``: a finite number. ``rollout_id`` / ``response_id`` (the completion's ``id``, e.g.
    ``chatcmpl-...``) / ``trace_id`` (hex or int): which rollout it judges. ``name``: the reward's name
    (default ``reward``). The span is exported by the process's OTel SDK like any other: a short-lived
    feedback process calls ``spanrl.instrumentation.configure()`` first and ``flush()`` before it exits.
    """
    try:
        keys = {"rollout_id": rollout_id, "response_id": response_id, "trace_id": trace_id}
        problem = _problem(value, keys)
        attrs: dict[str, Any] = {}
        event: dict[str, Any] = {}
        if problem is None:
            event = {semconv.GEN_AI_EVALUATION_NAME: semconv.DEFAULT_REWARD_NAME if name is None else str(name),
                     semconv.GEN_AI_EVALUATION_SCORE_VALUE: float(value)}
            if explanation is not None:
                event[semconv.GEN_AI_EVALUATION_EXPLANATION] = str(explanation)
            if rollout_id is not None:
                attrs[semconv.ROLLOUT_ID] = rollout_id
            elif response_id is not None:
                attrs[semconv.GEN_AI_RESPONSE_ID] = event[semconv.GEN_AI_RESPONSE_ID] = response_id
            else:
                attrs[semconv.FEEDBACK_TRACE_ID] = _trace_id_hex(trace_id)
        # A root span in an empty context: no parent, no baggage, so no other rollout's ids leak onto it.
        span = tracer().start_span(semconv.FEEDBACK_SPAN_NAME, context=context.Context(), kind=SpanKind.INTERNAL,
                                   attributes=attrs)
        try:
            if not span.is_recording():
                _warn_no_sdk()
            if problem is not None:
                _logger.warning("spanrl: %s", problem)
                if span.is_recording():
                    span.set_attribute(semconv.EMIT_ERROR, problem)
                    span.set_status(Status(StatusCode.ERROR, problem))
            else:
                span.add_event(semconv.GEN_AI_EVALUATION_RESULT_EVENT, attributes=event)
        finally:
            span.end()
    except Exception:
        _logger.exception("spanrl: emit_feedback failed")

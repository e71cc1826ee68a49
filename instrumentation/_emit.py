"""The emit API: rewards, observations, tool calls and agent scopes as spans (hand-made LLM calls:
``_llm_calls.py``).

Every function here is safe to call from agent code:

* with no OTel SDK configured (or installed) it is a no-op on the API's non-recording spans;
* it never raises: a bad value is logged as a warning and the span carries ``spanrl.emit.error`` with
  what was wrong (and, for a reward, no value, so a broken reward never trains anything);
* it imports no torch and nothing from the trainer side.

The span shapes are the contract in ``docs/conventions.md``.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from spanrl import semconv
from spanrl.instrumentation._rollout import _close, _decorate, tracer

__all__ = [
    "agent",
    "emit_observation",
    "emit_reward",
    "emit_tool_call",
]

_logger = logging.getLogger("spanrl.instrumentation")

F = TypeVar("F", bound=Callable[..., Any])
AttributeMap = Mapping[str, Any]
Messages = str | Mapping[str, Any] | Sequence[Mapping[str, Any]]
_ERROR_TYPE = "error.type"


# --- small helpers ----------------------------------------------------------------------------------


def _warn(span: Span | None, message: str) -> None:
    """Log a bad value and, on a recording span, say what was wrong (attribute + ERROR status)."""
    _logger.warning("spanrl: %s", message)
    if span is not None and span.is_recording():
        try:
            previous = getattr(span, "attributes", {}).get(semconv.EMIT_ERROR)
            span.set_attribute(semconv.EMIT_ERROR, f"{previous}; {message}" if previous else message)
            span.set_status(Status(StatusCode.ERROR, message))
        except Exception:
            _logger.exception("spanrl could not annotate span")


def _set_attributes(span: Span, attributes: AttributeMap | None, where: str) -> None:
    if attributes is None:
        return
    if not isinstance(attributes, Mapping):
        _warn(span,
              f"{where}: attributes must be a mapping of str to str/bool/int/float, got {type(attributes).__name__}")
        return
    for key, value in attributes.items():
        if not isinstance(key, str) or not _is_attribute_value(value):
            _warn(span, f"{where}: attribute {key!r} has unsupported value {value!r}; dropped")
            continue
        span.set_attribute(key, value)


def _is_attribute_value(value: Any) -> bool:
    scalar = (str, bool, int, float)
    if isinstance(value, scalar):
        return True
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, scalar) for v in value) and len({type(v) for v in value}) <= 1
    return False


def _to_text(value: Any) -> str:
    """A string as is; anything else as JSON (falling back to ``str`` for unknown objects)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _as_number(value: Any) -> float | None:
    """``value`` as a finite float, or None (bool counts as 0/1)."""
    if type(value) is float or isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _no_direct_route(name: str, keys: tuple[str, ...], values: tuple[Any, ...]) -> bool:
    return False


def _bind_direct_route(name: str, keys: tuple[str, ...], values: tuple[Any, ...]) -> bool:
    """The first reward: bind ``_emit_instant`` to ``_direct.emit_instant``, which needs the OTel SDK (the
    emit API does not), or to ``_no_direct_route``; then write this one."""
    global _emit_instant
    try:
        from spanrl.instrumentation._direct import emit_instant
    except ImportError:
        emit_instant = _no_direct_route
    _emit_instant = emit_instant
    return emit_instant(name, keys, values)


# A reward span straight into spanrl's export queue (``_direct.py``); False: make an SDK span.
_emit_instant: Callable[[str, tuple[str, ...], tuple[Any, ...]], bool] = _bind_direct_route

# A reward span's own attributes, in order: name, value, and the GenAI evaluation's score and name
_REWARD_KEYS = (semconv.REWARD_NAME, semconv.REWARD_VALUE, semconv.GEN_AI_EVALUATION_SCORE_VALUE,
                semconv.GEN_AI_EVALUATION_NAME)
_REWARD_SPAN_NAME, _DEFAULT_NAME = semconv.REWARD_SPAN_NAME, semconv.DEFAULT_REWARD_NAME


def _direct(keys: tuple[str, ...], values: tuple[Any, ...]) -> bool:
    try:
        return _emit_instant(_REWARD_SPAN_NAME, keys, values)
    except Exception:
        _direct_failed()
        return False


def _direct_failed() -> None:
    """An SDK whose internals differ: rewards are SDK spans from now on, as without ``_direct.py``."""
    global _emit_instant
    _logger.exception("spanrl: the direct reward span failed; recording rewards as SDK spans")
    _emit_instant = _no_direct_route


def _instant_span(name: str, *, kind: SpanKind = SpanKind.INTERNAL, attributes: dict[str, Any] | None = None) -> Span:
    return tracer().start_span(name, kind=kind, attributes=attributes)


# --- rewards ------------------------------------------------------------------------------------------


def emit_reward(
    value: float | Mapping[str, float],
    *,
    name: str | None = None,
    explanation: str | None = None,
    attributes: AttributeMap | None = None,
) -> None:
    """Record a reward: a ``spanrl.reward`` span, child of the current span, per reward.

    ``value`` is a number (``name`` defaults to ``"reward"``) or ``{name: number}`` for several named
    rewards (one span each). Each span carries ``spanrl.reward.value`` / ``spanrl.reward.name`` and the
    GenAI evaluation attributes ``gen_ai.evaluation.score.value`` / ``gen_ai.evaluation.name`` (plus
    ``gen_ai.evaluation.explanation`` if given). The last reward of a rollout is its episode reward.
    A value that is not a finite number is dropped with a warning; its span says why.
    """
    # The common call, one finite float (x - x is 0.0 for no other): its span goes straight to the export
    # queue with no attribute dict (between two LLM calls, caches cold, each call and lookup saved here is
    # about a microsecond); where the setup needs an SDK span, the general path below makes it.
    direct = True  # the direct route may take the span
    if type(value) is float and value - value == 0.0 and name is None and explanation is None and attributes is None:
        try:
            if _emit_instant(_REWARD_SPAN_NAME, _REWARD_KEYS, (_DEFAULT_NAME, value, value, _DEFAULT_NAME)):
                return
        except Exception:
            _direct_failed()
        direct = False  # it declined: an SDK span, without asking it again
    try:
        if type(value) is not float and isinstance(value, Mapping):  # a float skips the ABC check
            if name is not None:
                _logger.warning("spanrl: emit_reward got a dict and name=%r; the dict's keys name the rewards", name)
            for key, item in value.items():
                _emit_one_reward(item, str(key), explanation, attributes, direct)
        else:
            _emit_one_reward(value, _DEFAULT_NAME if name is None else str(name), explanation, attributes, direct)
    except Exception:
        _logger.exception("spanrl: emit_reward failed")


def _emit_one_reward(value: Any, name: str, explanation: str | None, attributes: AttributeMap | None,
                     direct: bool) -> None:
    number = _as_number(value)
    if number is None:
        attrs: dict[str, Any] = {semconv.REWARD_NAME: name}
    else:  # one attribute dict, set at start: cheaper than one set_attribute each
        attrs = dict(zip(_REWARD_KEYS, (name, number, number, name)))
        if explanation is not None:
            attrs[semconv.GEN_AI_EVALUATION_EXPLANATION] = str(explanation)
        if direct and attributes is None and _direct(tuple(attrs), tuple(attrs.values())):
            return
    span = _instant_span(semconv.REWARD_SPAN_NAME, attributes=attrs)
    try:
        if number is None:
            _warn(span, f"emit_reward: value of reward {name!r} must be a finite number, "
                        f"got {value!r} ({type(value).__name__})")

            return
        _set_attributes(span, attributes, "emit_reward")
    finally:
        span.end()


# --- observations -------------------------------------------------------------------------------------


def emit_observation(content: Any, *, attributes: AttributeMap | None = None) -> None:
    """Record what the agent observed (an environment state, a tool's output, a user turn).

    A ``spanrl.observation`` event with ``spanrl.observation.content`` (text, or JSON for other values)
    on the current span; with no current span, on a ``spanrl.observation`` span of its own.
    """
    try:
        try:
            text = _to_text(content)
            problem = None
        except Exception as exc:
            text, problem = repr(content), f"emit_observation: content is not JSON-serializable ({exc})"
        event_attrs: dict[str, Any] = {semconv.OBSERVATION_CONTENT: text}
        current = trace.get_current_span()
        if current.is_recording():
            if attributes:
                event_attrs.update({k: v for k, v in attributes.items() if _is_attribute_value(v)})
            current.add_event(semconv.OBSERVATION_EVENT, event_attrs)
            if problem:
                _warn(current, problem)
            return
        span = _instant_span(semconv.OBSERVATION_EVENT)
        try:
            span.add_event(semconv.OBSERVATION_EVENT, event_attrs)
            _set_attributes(span, attributes, "emit_observation")
            if problem:
                _warn(span, problem)
        finally:
            span.end()
    except Exception:
        _logger.exception("spanrl: emit_observation failed")


# --- tools --------------------------------------------------------------------------------------------


def emit_tool_call(
    name: str,
    arguments: Any = None,
    result: Any = None,
    *,
    call_id: str | None = None,
    error: str | BaseException | None = None,
    attributes: AttributeMap | None = None,
) -> None:
    """Record a tool call the agent made: an ``execute_tool {name}`` span (GenAI semconv).

    ``gen_ai.operation.name=execute_tool``, ``gen_ai.tool.name``, ``gen_ai.tool.call.arguments`` and
    ``gen_ai.tool.call.result`` (text, or JSON for other values), ``gen_ai.tool.call.id`` if given.
    ``error`` marks the call failed (status ERROR, ``error.type``).
    """
    try:
        tool_name = name if isinstance(name, str) and name else None
        span = _instant_span(
            f"{semconv.OP_EXECUTE_TOOL} {tool_name or 'unknown'}",
            attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_EXECUTE_TOOL},
        )
        try:
            if tool_name is None:
                _warn(span, f"emit_tool_call: name must be a non-empty string, got {name!r}")
            else:
                span.set_attribute(semconv.GEN_AI_TOOL_NAME, tool_name)
            if call_id is not None:
                span.set_attribute(semconv.GEN_AI_TOOL_CALL_ID, str(call_id))
            for key, value, label in (
                (semconv.GEN_AI_TOOL_CALL_ARGUMENTS, arguments, "arguments"),
                (semconv.GEN_AI_TOOL_CALL_RESULT, result, "result"),
            ):
                if value is None:
                    continue
                try:
                    span.set_attribute(key, _to_text(value))
                except Exception as exc:
                    span.set_attribute(key, repr(value))
                    _warn(span, f"emit_tool_call: {label} is not JSON-serializable ({exc}); recorded as repr")
            if error is not None:
                error_type = type(error).__name__ if isinstance(error, BaseException) else "ToolError"
                span.set_attribute(_ERROR_TYPE, error_type)
                span.set_status(Status(StatusCode.ERROR, str(error)))
            _set_attributes(span, attributes, "emit_tool_call")
        finally:
            span.end()
    except Exception:
        _logger.exception("spanrl: emit_tool_call failed")


# --- agents -------------------------------------------------------------------------------------------


class agent:  # noqa: N801 - used like a function: `with spanrl.agent("planner")` / `@spanrl.agent("planner")`
    """Run code as one agent of a multi-agent system: an ``invoke_agent {name}`` span.

    Context manager and decorator (sync and async; each call is its own span). The span carries
    ``gen_ai.operation.name=invoke_agent`` and ``gen_ai.agent.name``; LLM calls below it belong to that
    agent, so training can select one agent. The code's exception passes through unchanged.
    """

    def __init__(self, name: str, *, agent_id: str | None = None, attributes: AttributeMap | None = None) -> None:
        self.name = name
        self.agent_id = agent_id
        self.attributes = attributes
        self._stack: list[tuple[Span | None, object | None]] = []

    def __enter__(self) -> Span:
        span: Span | None = None
        token: object | None = None
        try:
            valid = isinstance(self.name, str) and bool(self.name)
            span = tracer().start_span(
                f"{semconv.OP_INVOKE_AGENT} {self.name if valid else 'unknown'}",
                kind=SpanKind.INTERNAL,
                attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_INVOKE_AGENT},
            )
            if valid:
                span.set_attribute(semconv.GEN_AI_AGENT_NAME, self.name)
            else:
                _warn(span, f"agent: name must be a non-empty string, got {self.name!r}")
            if self.agent_id is not None:
                span.set_attribute(semconv.GEN_AI_AGENT_ID, str(self.agent_id))
            _set_attributes(span, self.attributes, "agent")
            token = context.attach(trace.set_span_in_context(span))
        except Exception:
            _logger.exception("spanrl: agent(%r) could not open its span", self.name)
        self._stack.append((span, token))
        return span if span is not None else trace.INVALID_SPAN

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        span, token = self._stack.pop()
        _close(span, token, exc)

    def __call__(self, func: F) -> F:
        return _decorate(func, lambda: agent(self.name, agent_id=self.agent_id, attributes=self.attributes))

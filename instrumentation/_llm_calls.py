"""The emit API's hand-made LLM calls: ``emit_prompt`` / ``emit_response`` for an agent whose LLM client
no instrumentor covers. The same rules as ``_emit.py``: no-op without an SDK, never raises, no torch.
"""

from __future__ import annotations

import json
import logging
import numbers
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from spanrl import semconv
from spanrl.instrumentation._emit import AttributeMap, Messages, _as_number, _set_attributes, _warn
from spanrl.instrumentation._rollout import tracer

__all__ = ["LLMCall", "emit_prompt", "emit_response"]

_logger = logging.getLogger("spanrl.instrumentation")


# --- hand-made LLM calls ----------------------------------------------------------------------------


class LLMCall:
    """An LLM call opened by ``emit_prompt`` and closed by ``emit_response``.

    Also a context manager: on exit a call still open is ended anyway, marked ``spanrl.emit.error``
    ("no emit_response"), or with the exception that left the block, so no span is left unexported::

        with spanrl.emit_prompt(messages, model="m") as call:
            text = my_llm(messages)
            spanrl.emit_response(text, call=call)
    """

    def __init__(self, span: Span) -> None:
        self.span = span
        self.ended = False

    def __enter__(self) -> LLMCall:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self.ended:
            return
        try:
            self.ended = True
            _pending.set(tuple(c for c in _pending.get() if c is not self))
            if exc is not None:
                self.span.record_exception(exc)
                self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            else:
                _warn(self.span, "emit_prompt: the call was closed without emit_response")
            self.span.end()
        except Exception:
            _logger.exception("spanrl could not end the LLM call span")


_NO_CALL = LLMCall(trace.INVALID_SPAN)
_NO_CALL.ended = True
_pending: ContextVar[tuple[LLMCall, ...]] = ContextVar("spanrl_pending_llm_calls", default=())


def _parts(content: Any) -> list[dict[str, Any]]:
    """OpenAI message content (str, or a list of content parts) as GenAI semconv ``parts``."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and "text" in part:
                parts.append({"type": "text", "content": part["text"]})
            elif isinstance(part, Mapping):
                parts.append(dict(part))
            else:
                parts.append({"type": "text", "content": str(part)})
        return parts
    raise TypeError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def _message(message: Any, default_role: str) -> dict[str, Any]:
    """One message (a string, an OpenAI-style dict, or already GenAI-shaped) in the GenAI semconv shape."""
    if isinstance(message, str):
        return {"role": default_role, "parts": [{"type": "text", "content": message}]}
    if not isinstance(message, Mapping):
        raise TypeError(f"a message must be a string or a mapping with 'role', got {type(message).__name__}")
    if "parts" in message:
        return dict(message)
    role = message.get("role", default_role)
    parts = _parts(message.get("content"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        parts.append({"type": "tool_call", "id": call.get("id"), "name": function.get("name"), "arguments": arguments})
    if role == "tool":
        parts = [{"type": "tool_call_response", "id": message.get("tool_call_id"), "response": message.get("content")}]
    out: dict[str, Any] = {"role": role, "parts": parts}
    if "name" in message:
        out["name"] = message["name"]
    return out


def _messages_json(messages: Any, default_role: str, finish_reason: str | None = None) -> str:
    items = [messages] if isinstance(messages, (str, Mapping)) else list(messages)
    converted = [_message(m, default_role) for m in items]
    if finish_reason is not None:
        for m in converted:
            m.setdefault("finish_reason", finish_reason)
    return json.dumps(converted, ensure_ascii=False, default=str)


def _set_token_array(span: Span, key: str, values: Any, *, floats: bool, where: str) -> None:
    if values is None:
        return
    try:
        items = list(values)
    except TypeError:
        _warn(span, f"{where}: {key} must be a sequence of numbers, got {type(values).__name__}")
        return
    if floats:
        converted = [_as_number(v) for v in items]
        ok = all(v is not None for v in converted)
    else:
        ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in items)
        converted = [int(v) for v in items] if ok else []
    if not ok:
        _warn(span, f"{where}: {key} must hold only {'finite numbers' if floats else 'integers'}; dropped")
        return
    span.set_attribute(key, converted)


def emit_prompt(
    messages: Messages,
    *,
    model: str | None = None,
    operation: str = semconv.OP_CHAT,
    prompt_token_ids: Sequence[int] | None = None,
    attributes: AttributeMap | None = None,
) -> LLMCall:
    """Open an LLM call made without an instrumented client: a CLIENT span ``{operation} {model}``.

    ``messages``: a string (one user message), or OpenAI-style ``{"role", "content"}`` dicts; recorded
    as ``gen_ai.input.messages`` in the GenAI semconv shape (the one OpenLLMetry writes). Close it with
    ``emit_response``; the span is a child of the current span but does not become current.
    Returns the call handle (pass it to ``emit_response`` when several calls overlap).
    """
    try:
        name = f"{operation} {model}" if model else str(operation)
        span = tracer().start_span(name, kind=SpanKind.CLIENT, attributes={semconv.GEN_AI_OPERATION_NAME: operation})
        if model:
            span.set_attribute(semconv.GEN_AI_REQUEST_MODEL, model)
        try:
            span.set_attribute(semconv.GEN_AI_INPUT_MESSAGES, _messages_json(messages, "user"))
        except Exception as exc:
            _warn(span, f"emit_prompt: messages {messages!r:.200} cannot be recorded ({exc})")
        _set_token_array(span, semconv.LLM_PROMPT_TOKEN_IDS, prompt_token_ids, floats=False, where="emit_prompt")
        _set_attributes(span, attributes, "emit_prompt")
        call = LLMCall(span)
        _pending.set(_pending.get() + (call,))
        return call
    except Exception:
        _logger.exception("spanrl: emit_prompt failed")
        return _NO_CALL


def emit_response(
    message: Messages,
    *,
    call: LLMCall | None = None,
    model: str | None = None,
    response_id: str | None = None,
    finish_reason: str | None = "stop",
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    completion_token_ids: Sequence[int] | None = None,
    logprobs: Sequence[float] | None = None,
    attributes: AttributeMap | None = None,
) -> None:
    """Close an LLM call opened by ``emit_prompt`` (``call``, else the latest open one here).

    ``message``: the assistant's text or message dict(s), recorded as ``gen_ai.output.messages``; usage
    as ``gen_ai.usage.*``; exact token ids and logprobs, when the agent has them, as
    ``spanrl.llm.prompt_token_ids`` / ``completion_token_ids`` / ``logprobs``. Without an open call the
    response is recorded on a span of its own, marked with ``spanrl.emit.error``.
    """
    try:
        pending = _pending.get()
        if call is None:
            call = next((c for c in reversed(pending) if not c.ended), None)
        if call is not None and call in pending:
            _pending.set(tuple(c for c in pending if c is not call))
        orphan = call is None or call.ended
        if orphan:
            span = tracer().start_span(
                semconv.OP_CHAT if not model else f"{semconv.OP_CHAT} {model}",
                kind=SpanKind.CLIENT,
                attributes={semconv.GEN_AI_OPERATION_NAME: semconv.OP_CHAT},
            )
            _warn(span, "emit_response: no open emit_prompt call to close; recorded on its own span")
        else:
            span = call.span  # type: ignore[union-attr]
            call.ended = True  # type: ignore[union-attr]
        try:
            if model:
                span.set_attribute(semconv.GEN_AI_RESPONSE_MODEL, model)
            if response_id is not None:
                span.set_attribute(semconv.GEN_AI_RESPONSE_ID, str(response_id))
            if finish_reason is not None:
                span.set_attribute(semconv.GEN_AI_RESPONSE_FINISH_REASONS, [str(finish_reason)])
            try:
                span.set_attribute(semconv.GEN_AI_OUTPUT_MESSAGES, _messages_json(message, "assistant", finish_reason))
            except Exception as exc:
                _warn(span, f"emit_response: message {message!r:.200} cannot be recorded ({exc})")
            for key, count in ((semconv.GEN_AI_USAGE_INPUT_TOKENS, input_tokens),
                               (semconv.GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens)):

                if count is None:
                    continue
                if isinstance(count, numbers.Integral) and not isinstance(count, bool) and count >= 0:
                    span.set_attribute(key, int(count))
                else:
                    _warn(span, f"emit_response: {key} must be a non-negative integer, got {count!r}")
            _set_token_array(span, semconv.LLM_PROMPT_TOKEN_IDS, prompt_token_ids, floats=False, where="emit_response")
            _set_token_array(span, semconv.LLM_COMPLETION_TOKEN_IDS, completion_token_ids, floats=False,
                             where="emit_response")

            _set_token_array(span, semconv.LLM_LOGPROBS, logprobs, floats=True, where="emit_response")
            _set_attributes(span, attributes, "emit_response")
        finally:
            span.end()
    except Exception:
        _logger.exception("spanrl: emit_response failed")

"""Anthropic's Messages API, ``POST /v1/messages``, as a translation of the chat route.

``system``, the ``messages`` (text, ``tool_use`` and ``tool_result`` blocks) and ``tools`` (``input_schema``)
become chat messages and tools; the one chat choice becomes a ``message`` with ``text`` and ``tool_use``
blocks and its ``stop_reason``, or, with ``stream: true``, its events (``message_start``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``). Errors keep Anthropic's
shape ``{"type": "error", "error": {"type", "message"}}``; a full queue is ``529 overloaded_error`` with
``retry-after``. The answer carries ``prompt_token_ids``, ``token_ids``, ``token_logprobs`` and
``policy_version`` like every route's, and the server span is the chat route's under the message's id.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from spanrl.serving.errors import RequestError
from spanrl.serving.translated import Finished, build_call, finish, follow, refuse_set, sent_text

__all__ = ["create_message", "error_response", "message_input"]

_logger = logging.getLogger(__name__)

_RENAMES = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences", "messages": "messages"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
_RETRY_AFTER_S = "1"
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def error_response(exc: Exception) -> JSONResponse:
    """Anthropic's error body and status for ``exc``: a full queue as 529 with retry-after, others as 500."""
    if not isinstance(exc, RequestError):
        _logger.exception("unexpected error serving a messages request", exc_info=exc)
        exc = RequestError(f"internal error: {exc}", status=500)
    status = 529 if exc.code == "queue_full" else exc.status
    body = {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": exc.message}}
    headers = {"retry-after": _RETRY_AFTER_S} if status in (429, 529) else None
    return JSONResponse(body, status_code=status, headers=headers)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(b.get("text", "")) for b in content)
    raise RequestError(f"{where} must be a string or a list of text blocks", param=where)


def _blocks(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """The chat messages of one Messages message: tool results first (as ``tool`` messages), then the rest."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of content blocks", param=f"{where}.content")
    text, calls, results = [], [], []
    for j, block in enumerate(content):
        bw, kind = f"{where}.content[{j}]", block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise RequestError(f"{bw} needs a name and an input object", param=bw)
            calls.append({"id": str(block.get("id") or ""), "type": "function",
                          "function": {"name": block["name"], "arguments": block.get("input", {})}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id")),
                            "content": _text(block.get("content", ""), f"{bw}.content")})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # a client echoing a thinking block back loses nothing: these models think in plain text
        else:
            raise RequestError(f"{bw}: blocks of type {kind!r} are not supported here (text, tool_use on assistant "
                               "messages, tool_result on user messages)", param=bw)
    out = results
    if text or calls or not results:
        message: dict[str, Any] = {"role": role, "content": "".join(text) if text or not calls else None}
        if calls:
            message["tool_calls"] = calls
        out = out + [message]
    return out


def message_input(system: Any, messages: Any) -> list[dict[str, Any]]:
    """Chat messages of ``system`` and ``messages``."""
    out = [{"role": "system", "content": _text(system, "system")}] if system not in (None, "", []) else []
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of messages", param="messages")
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ("user", "assistant"):
            raise RequestError(f"messages[{i}].role must be 'user' or 'assistant', got {role!r}",
                               param=f"messages[{i}].role")
        out.extend(_blocks(role, msg.get("content"), f"messages[{i}]"))
    return out


def _tools(tools: Any, tool_choice: Any) -> list[dict[str, Any]] | None:
    if not tools or (isinstance(tool_choice, dict) and tool_choice.get("type") == "none"):
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of tools", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or not tool.get("name"):
            raise RequestError(f"tools[{i}] must be a client tool {{'name', 'description', 'input_schema'}}",
                               param=f"tools[{i}]")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise RequestError(f"tools[{i}].input_schema must be a JSON schema object",
                               param=f"tools[{i}].input_schema")
        out.append({"type": "function", "function": {"name": str(tool["name"]),
                                                     "description": tool.get("description") or "",
                                                     "parameters": schema}})
    return out


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    if body.get("max_tokens") is None:
        raise RequestError("max_tokens: field required", param="max_tokens")
    refuse_set(body, ("top_k",), "sampling is temperature and top_p")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"):
        raise RequestError("thinking is not supported by this server", param="thinking")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, (int, float)) and not 0 <= temperature <= 1):
        raise RequestError(f"temperature must be between 0 and 1, got {temperature!r}", param="temperature")
    return {"temperature": temperature, "top_p": body.get("top_p"), "max_completion_tokens": body.get("max_tokens"),
            "stop": body.get("stop_sequences") or None, "stream": body.get("stream")}


async def create_message(routes: Any, request: Request, rollout_of: Callable[[Request], dict[str, Any]]) -> Any:
    """``POST /v1/messages``: the message, or its event stream; every error in Anthropic's shape."""
    try:
        body = await routes._body(request)
        call = await build_call(routes, request, rollout_of, body=body,
                                messages=message_input(body.get("system"), body.get("messages")),
                                tools=_tools(body.get("tools"), body.get("tool_choice")), sampling=_sampling(body),
                                response_id="msg_" + uuid.uuid4().hex, renames=_RENAMES)
        if call.params.stream:
            return StreamingResponse(_events(routes.state, call), media_type="text/event-stream")
        return _message(routes.state, call, await finish(routes.state, call, request))
    except Exception as exc:  # noqa: BLE001 - every error answered in this API's shape
        return error_response(exc)


def _stop(state: Any, call: Any, choice: dict[str, Any]) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence`` of a choice (the stop string is what the text was cut before)."""
    reason = _STOP_REASONS.get(choice["finish_reason"], "end_turn")
    if reason == "end_turn" and call.params.sampling.stop:
        full = state.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
        text = choice["message"]["content"] or ""
        rest = full[len(text):] if full.startswith(text) else ""
        for stop in call.params.sampling.stop:
            if rest.startswith(stop):
                return "stop_sequence", stop
    return reason, None


def _content(choice: dict[str, Any]) -> list[dict[str, Any]]:
    message = choice["message"]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message["content"]}] if message["content"] else []
    for call in message.get("tool_calls") or []:
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": json.loads(call["function"]["arguments"])})
    return blocks


def _message(state: Any, call: Any, done: Finished | None) -> dict[str, Any]:
    model = state.config.model_name
    out: dict[str, Any] = {"id": call.response_id, "type": "message", "role": "assistant", "model": model,
                           "content": [], "stop_reason": None, "stop_sequence": None,
                           "usage": {"input_tokens": len(call.requests[0].prompt_ids), "output_tokens": 0},
                           "prompt_token_ids": call.requests[0].prompt_ids}
    if done is None:
        return out
    results, choice = done
    out["stop_reason"], out["stop_sequence"] = _stop(state, call, choice)
    out["content"] = _content(choice)
    out["usage"]["output_tokens"] = len(choice["token_ids"])
    out.update(token_ids=choice["token_ids"], token_logprobs=choice["token_logprobs"],
               policy_version=results[0].policy_version)
    return out


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def _events(state: Any, call: Any) -> AsyncIterator[str]:
    """The Messages event stream of one call."""
    yield _sse({"type": "message_start", "message": _message(state, call, None)})
    sent, opened = "", False
    text_start = _sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    try:
        async for event in follow(state, call):
            if isinstance(event, str):
                if not opened:
                    yield text_start
                opened = True
                yield _sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": event}})
                sent += event
            else:
                done = event
    except RequestError as exc:
        yield _sse(json.loads(error_response(exc).body))
        return
    final = _message(state, call, done)
    for index, block in enumerate(final["content"]):
        if block["type"] == "text":
            rest = sent_text(done[1], sent)
            if not opened:
                yield text_start
            if rest:
                yield _sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": rest}})
        else:
            yield _sse({"type": "content_block_start", "index": index,
                        "content_block": dict(block, input={})})
            yield _sse({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
        yield _sse({"type": "content_block_stop", "index": index})
    if opened and not any(b["type"] == "text" for b in final["content"]):
        yield _sse({"type": "content_block_stop", "index": 0})  # streamed text that the final answer does not keep
    extras = {k: final[k] for k in ("token_ids", "token_logprobs", "policy_version")}
    yield _sse({"type": "message_delta", "delta": {"stop_reason": final["stop_reason"],
                                                   "stop_sequence": final["stop_sequence"]},
                "usage": {"output_tokens": final["usage"]["output_tokens"]}, **extras})
    yield _sse({"type": "message_stop"})

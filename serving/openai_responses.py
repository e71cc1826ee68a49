"""The OpenAI Responses API, ``POST /v1/responses``, as a translation of the chat route.

``instructions`` and the ``input`` items (messages, ``function_call`` and ``function_call_output`` items) become
chat messages, function tools become chat tools, and the one chat choice becomes a ``Response`` with a
``message`` item and one ``function_call`` item per tool call, or, with ``stream: true``, its server-sent
events (``response.created`` ... ``response.completed``). The server keeps no state: every request carries its
whole conversation (``previous_response_id`` and ``conversation`` are refused). Errors keep the OpenAI shape
``{"error": {"message", "type", "param", "code"}}``. Like every route's answer, the response carries
``prompt_token_ids``, ``token_ids``, ``token_logprobs`` and ``policy_version``, and the server span is the
chat route's (``gen_ai.operation.name`` ``chat``), under the response's id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.requests import Request

from spanrl.serving.errors import RequestError
from spanrl.serving.responses import Call, ServerState
from spanrl.serving.translated import Finished, build_call, finish, follow, refuse_set, sent_text

__all__ = ["create_response", "input_messages", "response_tools"]

_RENAMES = {"max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens", "messages": "input"}
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
_TEXT_PARTS = ("input_text", "output_text", "text")
_ROLES = ("user", "system", "developer", "assistant")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS or not isinstance(part.get("text"),
                                                                                                   str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}[{j}] must be a text part ({'/'.join(_TEXT_PARTS)}), got {kind!r}",
                                   param=f"{where}[{j}]")
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"{where} must be a string or a list of text parts", param=where)


def _call_item(item: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str) or (key != "arguments" and not item[key]):
            raise RequestError(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}


def input_messages(instructions: Any, items: Any) -> list[dict[str, Any]]:
    """Chat messages of ``instructions`` and ``input`` (a string or a list of items); consecutive
    ``function_call`` items join the assistant message before them."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": _text(instructions, "instructions")})
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("input must be a non-empty string or list of input items", param="input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            if item.get("role") not in _ROLES:
                raise RequestError(f"{where}.role must be one of {list(_ROLES)}, got {item.get('role')!r}",
                                   param=f"{where}.role")
            messages.append({"role": item["role"], "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(_call_item(item, where))
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"{where}.call_id must be a string", param=f"{where}.call_id")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            continue  # this server's models reason in plain text; a client echoing an item back loses nothing
        else:
            raise RequestError(f"{where}: items of type {kind!r} are not supported (messages, function_call, "
                               "function_call_output)", param=where)
    return messages


def response_tools(tools: Any, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The chat tools of Responses function tools (``{"type": "function", "name", "parameters", ...}``)."""
    if tools is None or tools == [] or tool_choice == "none":
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of function tools", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestError(f"tools[{i}]: only function tools are supported, got {kind!r}", param=f"tools[{i}]")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise RequestError(f"tools[{i}].name must be a non-empty string", param=f"tools[{i}].name")
        params = tool.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise RequestError(f"tools[{i}].parameters must be a JSON schema object", param=f"tools[{i}].parameters")
        fn = {"name": tool["name"], "description": tool.get("description") or "", "parameters": params or {}}
        out.append({"type": "function", "function": fn})
    return out


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    refuse_set(body, ("previous_response_id", "conversation", "prompt"),
               "it keeps no state; send the whole conversation in input")
    refuse_set(body, ("background",), "responses are answered in the request")
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise RequestError("text.format: only {'type': 'text'} is supported", param="text.format")
    include = body.get("include") or []
    if not isinstance(include, list):
        raise RequestError("include must be a list of strings", param="include")
    logprobs = _LOGPROBS_INCLUDE in include or bool(body.get("top_logprobs"))
    return {"temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "max_completion_tokens": body.get("max_output_tokens"), "stream": body.get("stream"),
            "logprobs": logprobs, "top_logprobs": body.get("top_logprobs")}


async def create_response(routes: Any, request: Request, rollout_of: Callable[[Request], dict[str, Any]]) -> Any:
    """``POST /v1/responses``: the Response, or its event stream."""
    body = await routes._body(request)
    tools = response_tools(body.get("tools"), body.get("tool_choice"))
    call = await build_call(routes, request, rollout_of, body=body,
                            messages=input_messages(body.get("instructions"), body.get("input")),
                            tools=tools, sampling=_sampling(body), response_id="resp_" + uuid.uuid4().hex,
                            renames=_RENAMES)
    shape = _Shape(routes.state, call, body)
    if call.params.stream:
        return StreamingResponse(_events(shape), media_type="text/event-stream")
    return shape.response(await finish(routes.state, call, request))


class _Shape:
    """Builds the Response object and the output items of one call."""

    def __init__(self, state: ServerState, call: Call, body: dict[str, Any]) -> None:
        self.state, self.call, self.body = state, call, body
        self.message_id = "msg_" + uuid.uuid4().hex

    def response(self, done: Finished | None, status: str = "completed") -> dict[str, Any]:
        body, params = self.body, self.call.params
        out: dict[str, Any] = {
            "id": self.call.response_id, "object": "response", "created_at": self.call.start_ns // 1_000_000_000,
            "status": status, "error": None, "incomplete_details": None, "model": self.state.config.model_name,
            "instructions": body.get("instructions"), "output": [], "parallel_tool_calls": True,
            "temperature": params.sampling.temperature, "top_p": params.sampling.top_p,
            "max_output_tokens": body.get("max_output_tokens"), "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [], "text": {"format": {"type": "text"}}, "usage": None,
            "metadata": body.get("metadata") or {}, "store": False,
            "prompt_token_ids": self.call.requests[0].prompt_ids,
        }
        if done is None:
            return out
        results, choice = done
        if choice["finish_reason"] == "length":
            out["status"], out["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        out["output"] = self.items(choice)
        prompt, completion = len(results[0].prompt_ids), len(choice["token_ids"])
        out["usage"] = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": prompt + completion}
        out.update(token_ids=choice["token_ids"], token_logprobs=choice["token_logprobs"],
                   policy_version=results[0].policy_version)
        return out

    def text_part(self, text: str, choice: dict[str, Any] | None) -> dict[str, Any]:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        if choice is not None and choice["logprobs"] is not None:
            part["logprobs"] = choice["logprobs"]["content"]
        return part

    def message_item(self, choice: dict[str, Any] | None, status: str = "completed") -> dict[str, Any]:
        text = (choice["message"]["content"] or "") if choice is not None else None
        content = [self.text_part(text, choice)] if text is not None else []
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    def items(self, choice: dict[str, Any]) -> list[dict[str, Any]]:
        calls = choice["message"].get("tool_calls") or []
        out = [self.message_item(choice)] if choice["message"]["content"] or not calls else []
        return out + [_function_call(call) for call in calls]


def _function_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
            "name": fn["name"], "arguments": fn["arguments"], "status": "completed"}


def _sse(event: dict[str, Any], seq: list[int]) -> str:
    event["sequence_number"] = seq[0]
    seq[0] += 1
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


async def _events(shape: _Shape) -> AsyncIterator[str]:
    """The Responses event stream of one call."""
    seq = [0]
    start = shape.response(None, status="in_progress")
    yield _sse({"type": "response.created", "response": start}, seq)
    yield _sse({"type": "response.in_progress", "response": start}, seq)
    sent, opened = "", False
    msg = {"item_id": shape.message_id, "output_index": 0, "content_index": 0}
    opening = [{"type": "response.output_item.added", "output_index": 0,
                "item": shape.message_item(None, "in_progress")},
               {"type": "response.content_part.added", **msg, "part": shape.text_part("", None)}]
    try:
        async for event in follow(shape.state, shape.call):
            if isinstance(event, str):
                for first in opening if not opened else []:
                    yield _sse(first, seq)
                opened = True
                yield _sse({"type": "response.output_text.delta", **msg, "delta": event, "logprobs": []}, seq)
                sent += event
            else:
                done = event
    except RequestError as exc:
        yield _sse({"type": "error", "code": exc.code or exc.type, "message": exc.message, "param": exc.param}, seq)
        return
    _, choice = done
    final = shape.response(done)
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            rest = sent_text(choice, sent)
            for first in opening if not opened else []:
                yield _sse(first, seq)
            if rest:
                yield _sse({"type": "response.output_text.delta", **msg, "delta": rest, "logprobs": []}, seq)
            part = item["content"][0]
            yield _sse({"type": "response.output_text.done", **msg, "text": part["text"],
                        "logprobs": part.get("logprobs") or []}, seq)
            yield _sse({"type": "response.content_part.done", **msg, "part": part}, seq)
        else:
            added = dict(item, arguments="", status="in_progress")
            ids = {"item_id": item["id"], "output_index": index}
            yield _sse({"type": "response.output_item.added", "output_index": index, "item": added}, seq)
            yield _sse({"type": "response.function_call_arguments.delta", **ids, "delta": item["arguments"]}, seq)
            yield _sse({"type": "response.function_call_arguments.done", **ids, "name": item["name"],
                        "arguments": item["arguments"]}, seq)
        yield _sse({"type": "response.output_item.done", "output_index": index, "item": item}, seq)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield _sse({"type": kind, "response": final}, seq)

"""Chat messages and tools: validate what clients send, render it with the model's chat template,
and turn generated text back into OpenAI ``tool_calls``.

Two tool-call shapes are recognised in generated text, only for tools the request declared:

- ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (JSON, one object or a list): the shape
  of Hermes / Qwen / SmolLM2-style chat templates;
- ``<call> NAME V1 V2 ... </call>``: the tiny model's words (``spanrl.demo.tiny``); the values
  fill the tool's declared parameters in order, converted to their JSON-schema types.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from spanrl.serving.errors import RequestError

__all__ = ["normalize_messages", "normalize_tools", "parse_tool_calls", "render_prompt", "semconv_messages"]

_ROLES = ("system", "developer", "user", "assistant", "tool")
_JSON_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_WORD_CALL = re.compile(r"<call>\s+(.*?)\s*</call>", re.DOTALL)


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}[{j}] must be a text part {{'type': 'text', 'text': ...}}, got {kind!r}",
                                   param=f"{where}[{j}]")
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"{where} must be a string, a list of text parts or null, got {type(content).__name__}",
                       param=where)


def _arguments(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value) if value.strip() else {}
        except ValueError:
            raise RequestError(f"{where} must be a JSON object, got {value[:80]!r}", param=where) from None
        if isinstance(parsed, dict):
            return parsed
    raise RequestError(f"{where} must be a JSON object (or its string), got {str(value)[:80]!r}", param=where)


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated messages in the shape chat templates expect (content a string, tool-call arguments a
    dict, ``developer`` as ``system``). Raises RequestError naming the bad field."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of message objects", param="messages")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(f"{where} must be an object, got {type(msg).__name__}", param=where)
        role = msg.get("role")
        if role not in _ROLES:
            raise RequestError(f"{where}.role must be one of {list(_ROLES)}, got {role!r}", param=f"{where}.role")
        content = _text_of(msg.get("content"), f"{where}.content")
        norm: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
        calls = msg.get("tool_calls")
        if calls:
            if role != "assistant" or not isinstance(calls, list):
                raise RequestError(f"{where}.tool_calls must be a list on an assistant message",
                                   param=f"{where}.tool_calls")
            norm["tool_calls"] = []
            for j, call in enumerate(calls):
                cw = f"{where}.tool_calls[{j}]"
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                    raise RequestError(f"{cw}.function.name must be a non-empty string", param=f"{cw}.function.name")
                args = _arguments(fn.get("arguments", {}), f"{cw}.function.arguments")
                norm["tool_calls"].append(
                    {"id": call.get("id") or _call_id(), "type": "function",
                     "function": {"name": fn["name"], "arguments": args}}
                )
        elif msg.get("content") is None and role != "assistant":
            raise RequestError(f"{where}.content is required for role {role!r}", param=f"{where}.content")
        if role == "tool":
            if msg.get("tool_call_id") is not None:
                norm["tool_call_id"] = str(msg["tool_call_id"])
        if isinstance(msg.get("name"), str):
            norm["name"] = msg["name"]
        out.append(norm)
    return out


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Validated OpenAI ``tools`` (function tools), or None when there are none."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of {'type': 'function', 'function': {...}}", param="tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise RequestError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", param=f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"tools[{i}].function.name must be a non-empty string",
                               param=f"tools[{i}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object",
                               param=f"tools[{i}].function.parameters")

    return tools


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """Prompt token ids: the model's chat template with a generation prompt, then the tokenizer."""
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError("this model has no chat template; use /v1/completions", param="messages", status=400)
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # jinja2 errors, raise_exception() in templates
        raise RequestError(f"messages: the model's chat template rejected them: {exc}", param="messages") from exc
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _convert(value: str, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "integer":
        return int(value)
    if kind == "number":
        number = float(value)
        return int(number) if number.is_integer() and "." not in value else number
    if kind == "boolean":
        if value.lower() not in ("true", "false"):
            raise ValueError(value)
        return value.lower() == "true"
    return value


def parse_tool_calls(text: str, tools: list[dict[str, Any]] | None) -> tuple[str | None, list[dict[str, Any]]]:
    """Split generated text into (content, OpenAI tool_calls). Calls of undeclared tools, or whose
    arguments do not fit, stay in the content."""
    if not tools:
        return text, []
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    calls: list[dict[str, Any]] = []

    def json_call(match: re.Match[str]) -> str:
        try:
            payload = json.loads(match.group(1))
        except (ValueError, RecursionError):
            return match.group(0)
        items = payload if isinstance(payload, list) else [payload]
        found = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or item["name"] not in by_name:
                return match.group(0)
            args = item.get("arguments", item.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except (ValueError, RecursionError):
                    return match.group(0)
            if not isinstance(args, dict):  # `[56, 0]`: not a call the server would take back in a request
                return match.group(0)
            found.append(_openai_call(item["name"], args))
        calls.extend(found)
        return ""

    def word_call(match: re.Match[str]) -> str:
        words = match.group(1).split()
        if not words or words[0] not in by_name:
            return match.group(0)
        props = (by_name[words[0]].get("parameters") or {}).get("properties") or {}
        values = words[1:]
        if not isinstance(props, dict) or len(values) != len(props):  # a schema of any shape: no call, never a 500
            return match.group(0)
        try:
            args = {name: _convert(v, schema if isinstance(schema, dict) else {})
                    for (name, schema), v in zip(props.items(), values)}
        except (ValueError, TypeError):  # TypeError: a "type" that is a list or an object
            return match.group(0)
        calls.append(_openai_call(words[0], args))
        return ""

    rest = _JSON_CALL.sub(json_call, text)
    rest = _WORD_CALL.sub(word_call, rest).strip()
    if not calls:
        return text, []
    return (rest or None), calls


def _openai_call(name: str, args: Any) -> dict[str, Any]:
    return {"id": _call_id(), "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def semconv_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the GenAI semantic-convention shape (``gen_ai.input.messages``): role + parts."""
    out = []
    for msg in messages:
        parts: list[dict[str, Any]] = []
        if msg["role"] == "tool":
            parts.append({"type": "tool_call_response", "id": msg.get("tool_call_id"), "response": msg.get("content")})
        elif msg.get("content"):
            parts.append({"type": "text", "content": msg["content"]})
        for call in msg.get("tool_calls") or []:
            args = call["function"]["arguments"]
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": call["function"]["name"],
                    "arguments": json.loads(args) if isinstance(args, str) else args,
                }
            )
        entry: dict[str, Any] = {"role": msg["role"], "parts": parts}
        if msg.get("finish_reason"):
            entry["finish_reason"] = msg["finish_reason"]
        out.append(entry)
    return out

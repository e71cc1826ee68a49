"""Token ids for an LLM call known only by its messages (an external API, or a client span no policy-server
span pairs with): the policy's chat template applied to the ``gen_ai.*.messages`` the span recorded.

A ``generic`` part (semantic-conventions-genai: a provider block no part type fits, ``generic_type`` optional, its
other fields the provider's) reaches the prompt as the text it carries: its ``title`` and ``source`` (a document
or search result the model read), then its ``content`` (a string, or blocks with ``text``), one per line, on a
line of its own; a part with none of them (opaque ``data`` such as ``redacted_thinking``'s, ``cache_control``, a
``payload``) adds no text. The store keeps every field of every part as recorded.

The ids are the policy's own reading of that text, not what produced it, so the call has no log-probs
(`load_transitions` counts it as ``retokenized``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["retokenize"]


def _hf_message(msg: Mapping[str, Any]) -> dict[str, Any]:
    """A gen_ai.*.messages entry (OTel ``parts``, or OpenAI ``content``) as a chat-template message."""
    role = msg.get("role")
    if "parts" not in msg:
        return {k: v for k, v in msg.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")}
    texts: list[tuple[str, bool]] = []  # (text, a generic part's: on lines of its own)
    tool_calls: list[dict[str, Any]] = []
    out: dict[str, Any] = {"role": role}
    for part in msg.get("parts") or []:
        kind = part.get("type")
        if kind == "text":
            texts.append((str(part.get("content", "")), False))
        elif kind == "tool_call":
            tool_calls.append(
                {
                    "id": part.get("id"),
                    "type": "function",
                    "function": {"name": part.get("name"), "arguments": part.get("arguments") or {}},
                }
            )
        elif kind == "generic":  # a provider block no part type fits (semantic-conventions-genai #584)
            if text := _generic_text(part):
                texts.append((text, True))
        elif kind == "tool_call_response":
            response = part.get("response")
            texts.append((response if isinstance(response, str) else json.dumps(response), False))
            out["tool_call_id"] = part.get("id")
    out["content"] = "".join(("\n" if i and (block or texts[i - 1][1]) else "") + text
                             for i, (text, block) in enumerate(texts))
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out


def _generic_text(part: Mapping[str, Any]) -> str:
    """The text a generic part carries (module docstring): title, source, content text, one per line."""
    content = part.get("content")
    if isinstance(content, Mapping):
        content = [content]
    if isinstance(content, list):
        blocks = [b.get("text", b.get("content")) if isinstance(b, Mapping) else b for b in content]
        content = "".join(t for t in blocks if isinstance(t, str))
    lines = [part.get("title"), part.get("source"), content]
    return "\n".join(line for line in lines if isinstance(line, str) and line)


def _ids(encoded: Any) -> list[int]:
    if hasattr(encoded, "keys") and "input_ids" in encoded:  # transformers 5 returns a BatchEncoding
        encoded = encoded["input_ids"]
    return [int(i) for i in encoded]


def retokenize(tokenizer: Any, input_json: str, output_json: str | None) -> tuple[list[int], list[int]]:
    """Prompt and completion ids of a call known only by its messages, with the policy's chat template."""
    messages = [_hf_message(m) for m in json.loads(input_json)]
    outputs = [_hf_message(m) for m in json.loads(output_json or "[]")]
    if not outputs:
        raise ValueError("the call has no output message")
    prompt = _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    full = _ids(tokenizer.apply_chat_template(messages + outputs[:1], tokenize=True))
    if full[: len(prompt)] == prompt:
        return prompt, full[len(prompt) :]
    return prompt, _ids(tokenizer.encode(outputs[0].get("content", ""), add_special_tokens=False))

"""Token ids for an LLM call known only by its messages (an external API, or a client span no policy-server
span pairs with): the policy's chat template applied to the ``gen_ai.*.messages`` the span recorded.

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
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    out: dict[str, Any] = {"role": role}
    for part in msg.get("parts") or []:
        kind = part.get("type")
        if kind == "text":
            texts.append(str(part.get("content", "")))
        elif kind == "tool_call":
            tool_calls.append(
                {
                    "id": part.get("id"),
                    "type": "function",
                    "function": {"name": part.get("name"), "arguments": part.get("arguments") or {}},
                }
            )
        elif kind == "generic":  # a provider block no part type fits (semantic-conventions-genai #584)
            texts.append(_generic_text(part.get("content")))
        elif kind == "tool_call_response":
            response = part.get("response")
            texts.append(response if isinstance(response, str) else json.dumps(response))
            out["tool_call_id"] = part.get("id")
    out["content"] = "".join(texts)
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out


def _generic_text(content: Any) -> str:
    """The text a generic part carries: its ``content`` string, or the text of the blocks it lists."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, list):
        return ""
    texts = [b.get("text", b.get("content")) if isinstance(b, Mapping) else b for b in content]
    return "".join(t for t in texts if isinstance(t, str))


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

"""Which rollout a request names, as attributes for its server spans (the store decides the rest).

spanrl's own ids, the path winning over the headers::

    /rollouts/{rollout_id}[/attempts/{attempt}]/v1/...   x-spanrl-rollout-id
    /tasks/{task_id}/rollouts/{rollout_id}/...           x-spanrl-task-id, x-spanrl-attempt

A production agent sends none of them. It may name its conversation (``gen_ai.conversation.id``, the
GenAI conventions' id of a multi-turn session), which the server records on its span from the first of:

* the body's ``metadata.conversation_id`` or ``metadata["gen_ai.conversation.id"]`` (OpenAI's ``metadata``);
* the body's ``conversation`` (the Responses API: an id, or ``{"id": ...}``);
* the W3C ``baggage`` entry ``gen_ai.conversation.id`` (what OTel context propagation sends);
* the header ``x-gen-ai-conversation-id``.

With or without it, the store attributes the call to a rollout by one rule (``store/views.sql``,
``trace_rollouts``; ``docs/conventions.md``): its conversation, else the caller's trace, else the response.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from spanrl import semconv
from spanrl.serving.errors import RequestError

__all__ = ["CONVERSATION_HEADER", "conversation_of", "rollout_of"]

CONVERSATION_HEADER = "x-gen-ai-conversation-id"
_ROLLOUT_HEADER, _TASK_HEADER, _ATTEMPT_HEADER = "x-spanrl-rollout-id", "x-spanrl-task-id", "x-spanrl-attempt"
_METADATA_KEYS = ("conversation_id", semconv.GEN_AI_CONVERSATION_ID)
_MAX_ID_CHARS = 512  # OpenAI's limit on a metadata value


def _baggage_entry(header: str | None, key: str) -> str | None:
    """The value of ``key`` in a W3C ``baggage`` header (``k=v;props, k2=v2``), percent-decoded."""
    for member in (header or "").split(","):
        name, sep, value = member.split(";", 1)[0].partition("=")
        if sep and name.strip() == key:
            return unquote(value.strip())
    return None


def _checked(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > _MAX_ID_CHARS:
        raise RequestError(f"{where} must be a string of at most {_MAX_ID_CHARS} characters, got {value!r:.80}",
                           param=where)
    return value


def conversation_of(headers: Mapping[str, str], body: Mapping[str, Any] | None) -> str | None:
    """The conversation id a request names (see the module docstring for where), or None."""
    body = body or {}
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        for key in _METADATA_KEYS:
            found = _checked(metadata.get(key), f"metadata.{key}")
            if found:
                return found
    conversation = body.get("conversation")
    if isinstance(conversation, Mapping):
        conversation = conversation.get("id")
    found = _checked(conversation, "conversation")
    if found:
        return found
    found = _checked(_baggage_entry(headers.get("baggage"), semconv.GEN_AI_CONVERSATION_ID), "baggage")
    return found or _checked(headers.get(CONVERSATION_HEADER), CONVERSATION_HEADER)


def rollout_of(request: Any, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The rollout attributes of a request: spanrl's ids from its path, else its ``x-spanrl-*`` headers, and
    the conversation id it names (``body``: the parsed JSON body, None when it has none)."""
    path, headers = request.path_params, request.headers
    attrs: dict[str, Any] = {}
    rollout = path.get("rollout_id") or headers.get(_ROLLOUT_HEADER)
    task = path.get("task_id") or headers.get(_TASK_HEADER)
    attempt = path.get("attempt") or headers.get(_ATTEMPT_HEADER)
    if rollout:
        attrs[semconv.ROLLOUT_ID] = rollout
    if task:
        attrs[semconv.TASK_ID] = task
    if attempt:
        try:
            attrs[semconv.ATTEMPT] = int(attempt)
        except ValueError:
            raise RequestError(f"attempt must be an integer, got {attempt!r}", param="attempt") from None
    seed = path.get("seed")  # /rollouts/{rollout_id}/seeds/{seed}: seeds the rollout's calls (spanrl.seeding)
    if seed is not None:
        try:
            attrs[semconv.ROLLOUT_SEED] = int(seed)
        except ValueError:
            raise RequestError(f"seed in the path must be an integer, got {seed!r}", param="seed") from None
    conversation = conversation_of(headers, body)
    if conversation:
        attrs[semconv.GEN_AI_CONVERSATION_ID] = conversation
    return attrs

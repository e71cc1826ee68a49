"""The messages of a call the decomposer found none for on its span: content kept elsewhere, by reference.

An upload hook (opentelemetry-util-genai's fsspec one) may write a call's messages to an object store and put
only URIs on the span: ``gen_ai.input.messages_ref``, ``gen_ai.output.messages_ref``,
``gen_ai.system_instructions_ref`` (the span attributes, else the ``gen_ai.client.inference.operation.details``
event's). semantic-conventions-genai defines these names only on the upload's ``gen_ai.content.storage.result``
event (``gen_ai.content.storage.status`` ``stored`` | ``dropped`` | ``failed``, ``error.type`` on failure): a
URI only that event names (status ``stored``) is read too, and a ``dropped`` or ``failed`` upload is the note's
reason. decomposer.sql gathers all of it in ``message_sources`` with the inline system instructions. `resolve`
reads each URI through fsspec when it is under a prefix ``SPANRL_MESSAGE_REFS`` allows (span data names the
URI, so reading is opt-in: fail closed), puts the system instructions first when the input has no system
message, and notes per rollout every call whose messages stayed unread: such a call keeps no messages, so it
is never trained on an empty prompt (load_transitions counts it as ``skipped_no_ids``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa

from spanrl import env
from spanrl import semconv as sc

__all__ = ["SOURCES_COLUMN", "resolve"]

SOURCES_COLUMN = "message_sources"
_MAX_REF_BYTES = 16 * 1024 * 1024  # one call's messages; a larger object is refused, not read into memory whole
_logger = logging.getLogger(__name__)
_REF_ATTRIBUTES = {"input_messages": sc.GEN_AI_INPUT_MESSAGES_REF, "output_messages": sc.GEN_AI_OUTPUT_MESSAGES_REF,
                   "system_instructions": sc.GEN_AI_SYSTEM_INSTRUCTIONS_REF}
_STORAGE_STATUS, _ERROR_TYPE = sc.GEN_AI_CONTENT_STORAGE_STATUS, sc.ERROR_TYPE


def _allowed() -> tuple[str, ...]:
    raw = env.get_str(env.SPANRL_MESSAGE_REFS) or ""
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _under(uri: str, allowed: tuple[str, ...]) -> bool:
    """Whether ``uri`` lies under one of the ``allowed`` prefixes, as a path: at a ``/`` boundary (``refs`` does
    not allow ``refs-other``), with no ``..`` segment that would climb out and no fsspec chaining (``::``)."""
    if "::" in uri or any(seg in ("..", ".") for seg in uri.split("://", 1)[-1].split("/")):
        return False
    return any(uri == prefix or uri.startswith(prefix if prefix.endswith("/") else prefix + "/") for prefix in allowed)


def _read(uri: str, allowed: tuple[str, ...]) -> tuple[Any, str | None]:
    """``(value, None)``: the list the object at ``uri`` holds (a JSON array, one object, or JSON lines);
    ``(None, why)`` when it cannot be read."""
    if not _under(uri, allowed):
        return None, f"not under a prefix SPANRL_MESSAGE_REFS allows ({', '.join(allowed) or 'none set'})"
    try:
        import fsspec

        with fsspec.open(uri, "rb") as f:
            data = f.read(_MAX_REF_BYTES + 1)
    except Exception as exc:  # noqa: BLE001 - any filesystem's failure is a note, never a crash
        return None, f"{type(exc).__name__}: {exc}"
    if len(data) > _MAX_REF_BYTES:
        return None, f"larger than {_MAX_REF_BYTES} bytes"
    text = data.decode("utf-8", errors="replace")
    try:
        value = json.loads(text)
    except ValueError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()], None
        except ValueError as exc:
            return None, f"not JSON or JSON lines: {exc}"
    return ([value] if isinstance(value, dict) else value), None  # one line of JSON lines: one message


def _with_system(messages: Any, system: Any) -> Any:
    """``messages`` with a system message of ``system``'s parts first, unless they start with one."""
    if isinstance(system, str):
        try:
            system = json.loads(system)
        except ValueError:
            system = [{"type": "text", "content": system}]
    if not isinstance(messages, list) or not system:
        return messages
    if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
        return messages
    parts = system if isinstance(system, list) else [system]
    return [{"role": "system", "parts": parts}, *messages]


def _storage_results(events: Any) -> dict[str, tuple[str, str, str]]:
    """By content name, the last ``gen_ai.content.storage.result`` event's ``(uri, status, error)`` (status
    ``stored`` | ``dropped`` | ``failed``; error: ``" (error.type ...)"`` or empty) among ``events``' attributes."""
    found: dict[str, tuple[str, str, str]] = {}
    for attributes in events or ():
        if isinstance(attributes, str):
            attributes = json.loads(attributes)
        if not isinstance(attributes, dict):
            continue
        status = str(attributes.get(_STORAGE_STATUS) or "reported without a status")
        error = f" ({_ERROR_TYPE} {attributes[_ERROR_TYPE]})" if attributes.get(_ERROR_TYPE) else ""
        for name in ("input_messages", "output_messages", "system_instructions"):
            uri = attributes.get(_REF_ATTRIBUTES[name])
            if isinstance(uri, str) and uri:
                found[name] = (uri, status, error)
    return found


def resolve(calls: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """``calls`` with the ``message_sources`` column applied and dropped, and the counts of calls whose
    referenced messages were read (``message_refs_read``) or stayed unread (``message_refs_unread``)."""
    sources = calls.column(SOURCES_COLUMN)
    calls = calls.drop_columns([SOURCES_COLUMN])
    counts = {"message_refs_read": 0, "message_refs_unread": 0}
    if sources.null_count == len(sources):
        return calls, counts
    fields = [f for f in ("input_messages", "output_messages") if f in calls.column_names]
    values = {f: calls.column(f).to_pylist() for f in fields}
    rollouts = calls.column("rollout_id").to_pylist()
    allowed, cache, notes = _allowed(), {}, {}
    for i, raw in enumerate(sources.to_pylist()):
        if raw is None:
            continue
        src, read, unread = json.loads(raw), False, []
        system, stored = src.get("system_instructions"), _storage_results(src.get("storage"))
        for name in ("input_messages", "output_messages", "system_instructions"):
            inline = system if name == "system_instructions" else values[name][i] if name in values else "unasked"
            if inline is not None:
                continue
            uri, status = src.get(f"{name}_ref"), stored.get(name)
            if status is not None and status[1] != "stored":
                unread.append(f"{name}_ref {uri or status[0]!r}: the upload reported it {status[1]}{status[2]}")
                continue
            uri = uri or (status[0] if status is not None else None)
            if not uri:
                continue
            if uri not in cache:
                cache[uri] = _read(uri, allowed)
            value, why = cache[uri]
            if why is not None:
                unread.append(f"{name}_ref {uri!r}: {why}")
            elif name == "system_instructions":
                system, read = value, True
            else:
                values[name][i], read = json.dumps(value), True
        if "input_messages" in values and values["input_messages"][i] is not None and system is not None:
            values["input_messages"][i] = json.dumps(_with_system(json.loads(values["input_messages"][i]), system))
        counts["message_refs_read"] += read
        if unread:
            counts["message_refs_unread"] += 1
            note = notes.setdefault(rollouts[i], [0, set()])
            note[0] += 1
            note[1].update(unread)
    for rollout_id, (n, why) in notes.items():
        _logger.warning("rollout %s: %d call(s) whose messages are kept elsewhere could not read them, so they keep "
                        "no prompt and are not trained on: %s", rollout_id, n, "; ".join(sorted(why)))
    for f in fields:
        calls = calls.set_column(calls.column_names.index(f), f, pa.array(values[f], pa.string()))
    return calls, counts

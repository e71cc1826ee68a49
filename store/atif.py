"""ATIF, Harbor's Agent Trajectory Interchange Format (RFC 0001, v1.4), out of the store and into it.

Out (`export_atif`): one trajectory per rollout, from the decomposer (the one reading of the store): a
``system`` / ``user`` step per message of the first call's input, then per LLM call an ``agent`` step with its
output text, ``reasoning_content``, ``tool_calls`` (the output's tool-call parts), the tool results and user
turns the next call was sent (``observation`` / a ``user`` step), and ``metrics``: ``prompt_token_ids``,
``completion_token_ids`` and ``logprobs`` where the store has them (the policy server's), with their counts.
What ATIF has no field for rides in ``extra.spanrl``: the rollout's ids, each step's policy version and the
temperature its log-probs were computed at, and the rewards with the step they followed (ATIF v1.4 names
``reward`` only as an RL field to come, so the root's ``extra.reward`` holds the episode reward).

In (`atif_requests`): each trajectory as OTLP/JSON requests for `store/importing.py`'s path through the
collector: a ``spanrl.rollout`` span, per agent step a chat span (with token ids: the policy server's SERVER
shape, whose token ids count only from a sender the collector grants the policy scope; else a CLIENT span
with the conversation so far as ``gen_ai.input.messages``), an ``invoke_agent`` span per agent named, and a
``spanrl.reward`` span per reward after its step. Ids are derived from the session id, so a re-import sends
nothing the store holds.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import orjson

from spanrl import semconv as sc
from spanrl.errors import ConfigError

__all__ = ["ATIF_VERSION", "atif_requests", "export_atif", "read_atif"]

ATIF_VERSION = "ATIF-v1.4"
_BASE_NS = 1_700_000_000_000_000_000  # when a trajectory has no timestamps: its steps 10 ms apart from here
_STEP_NS = 10_000_000
_KIND = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3}


# --- out -------------------------------------------------------------------------------------------------
def _parts_text(message: dict[str, Any], kinds: tuple[str, ...]) -> str:
    if "parts" not in message:
        content = message.get("content")
        return content if isinstance(content, str) and "text" in kinds else ""
    return "".join(str(p.get("content", "")) for p in message.get("parts") or () if p.get("type") in kinds)


def _messages(raw: str | None) -> list[dict[str, Any]]:
    try:
        value = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [m for m in value if isinstance(m, dict)] if isinstance(value, list) else []


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _agent_step(call: dict[str, Any], step_id: int) -> dict[str, Any]:
    out = _messages(call.get("output_messages"))
    first = out[0] if out else {}
    step: dict[str, Any] = {"step_id": step_id, "source": "agent", "message": _parts_text(first, ("text",))}
    if call.get("order_ns") is not None:
        step["timestamp"] = _iso(call["order_ns"])
    reasoning = _parts_text(first, ("reasoning",))
    if reasoning:
        step["reasoning_content"] = reasoning
    tool_calls = [{"tool_call_id": str(p.get("id") or ""), "function_name": str(p.get("name") or ""),
                   "arguments": p.get("arguments") if isinstance(p.get("arguments"), dict) else {}}
                  for p in first.get("parts") or () if p.get("type") == "tool_call"]
    if tool_calls:
        step["tool_calls"] = tool_calls
    metrics: dict[str, Any] = {}
    if call.get("prompt_ids") is not None:
        metrics.update(prompt_tokens=len(call["prompt_ids"]), prompt_token_ids=list(call["prompt_ids"]))
    if call.get("completion_ids") is not None:
        metrics.update(completion_tokens=len(call["completion_ids"]), completion_token_ids=list(call["completion_ids"]))
    if call.get("logprobs") is not None:
        metrics["logprobs"] = [float(x) for x in call["logprobs"]]
    if metrics:
        step["metrics"] = metrics
    step["extra"] = {"spanrl": {k: call.get(k) for k in ("step", "agent", "policy_version", "temperature",
                                                         "response_id", "status_code")}}
    return step


def _trajectory(rollout: dict[str, Any], calls: list[dict[str, Any]], rewards: list[dict[str, Any]]) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    seen = 0  # messages of the conversation already in steps
    for call in calls:
        inputs = _messages(call.get("input_messages"))
        for m in inputs[seen:]:
            role = m.get("role")
            if role == "tool" and steps and steps[-1]["source"] == "agent":
                results = steps[-1].setdefault("observation", {"results": []})["results"]
                for p in m.get("parts") or ():
                    response = p.get("response")
                    results.append({"source_call_id": p.get("id"), "content": response if isinstance(response, str)
                                    else json.dumps(response)})
            elif role in ("system", "user"):
                steps.append({"step_id": len(steps) + 1, "source": role, "message": _parts_text(m, ("text",))})
        steps.append(_agent_step(call, len(steps) + 1))
        seen = len(inputs) + len(_messages(call.get("output_messages"))[:1])
    last = max(rewards, key=lambda r: (r["ingested_ns"], r["time_ns"]), default=None)
    agent = next((c["agent"] for c in calls if c.get("agent")), None) or "agent"
    if last is not None and not math.isfinite(last["value"]):
        last = None
    return {
        "schema_version": ATIF_VERSION,
        "session_id": rollout["rollout_id"],
        "agent": {"name": agent, "version": "unknown"},
        "steps": steps,
        "final_metrics": {"total_prompt_tokens": sum(s.get("metrics", {}).get("prompt_tokens", 0) for s in steps),
                          "total_completion_tokens": sum(s.get("metrics", {}).get("completion_tokens", 0)
                                                         for s in steps),
                          "total_steps": len(steps)},
        "extra": {"reward": None if last is None else last["value"], "spanrl": {
            **{k: rollout.get(k) for k in ("rollout_id", "task_id", "attempt", "mode", "status")},
            "rewards": [{"name": r["name"], "value": r["value"] if math.isfinite(r["value"]) else None,
                         "step": r["step"], "source": r["source"]} for r in rewards]}},
    }


# The messages of the client spans of calls the policy server served (the decomposer reads them only for
# calls without token ids): the steps' text, tool calls and observations.
_CLIENT_MESSAGES = """
SELECT trace_id, span_id, coalesce(attributes ->> '$."gen_ai.input.messages"', d ->> '$."gen_ai.input.messages"') AS i,
       coalesce(attributes ->> '$."gen_ai.output.messages"', d ->> '$."gen_ai.output.messages"') AS o
FROM (SELECT *, event_attributes(events, 'gen_ai.client.inference.operation.details') AS d FROM spans
      WHERE list_contains($spans, span_id))
"""


def _add_client_messages(store: Any, calls: list[dict[str, Any]]) -> None:
    wanted = {(c["client_trace_id"], c["client_span_id"]) for c in calls
              if c.get("input_messages") is None and c.get("client_span_id")}
    if not wanted:
        return
    rows = store.sql(_CLIENT_MESSAGES, {"spans": sorted({s for _, s in wanted})}).to_pylist()
    found = {(r["trace_id"], r["span_id"]): r for r in rows}
    for c in calls:
        r = found.get((c.get("client_trace_id"), c.get("client_span_id")))
        if r is not None and c.get("input_messages") is None:
            c["input_messages"], c["output_messages"] = r["i"], r["o"]


def export_atif(store: Any, *, rollout_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """One ATIF trajectory per rollout of ``store`` (all, or ``rollout_ids``), in rollout id order."""
    from spanrl.store.decomposer import Selection, decompose

    dec = decompose(store, Selection(rollout_ids=rollout_ids))
    rows = dec.calls.to_pylist()
    _add_client_messages(store, rows)
    calls: dict[str, list[dict[str, Any]]] = {}
    for c in rows:
        calls.setdefault(c["rollout_id"], []).append(c)
    rewards: dict[str, list[dict[str, Any]]] = {}
    for r in dec.rewards.to_pylist():
        rewards.setdefault(r["rollout_id"], []).append(r)
    ordered = sorted(dec.rollouts.to_pylist(), key=lambda r: r["rollout_id"])
    return [_trajectory(r, calls.get(r["rollout_id"], []), rewards.get(r["rollout_id"], [])) for r in ordered]


# --- in --------------------------------------------------------------------------------------------------
def read_atif(path: str) -> Iterator[dict[str, Any]]:
    """The trajectories of ``path``: one ATIF object, a JSON array of them, or one per line."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        doc = orjson.loads(data)
        docs = doc if isinstance(doc, list) else [doc]
    except orjson.JSONDecodeError:
        try:
            docs = [orjson.loads(line) for line in data.splitlines() if line.strip()]
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not an ATIF trajectory, a JSON array of them, or JSON lines ({exc})") from None
    for i, traj in enumerate(docs, 1):
        if not isinstance(traj, dict) or not isinstance(traj.get("session_id"), str) \
                or not isinstance(traj.get("steps"), list):
            raise ConfigError(f"{path}: trajectory {i} must be an object with session_id (string) and steps (array), "
                              f"got {str(traj)[:80]!r}")
        yield traj


def _id(n: int, *parts: object) -> str:
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).hexdigest()[:n]


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": v if isinstance(v, str) else json.dumps(v)}


def _attrs(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in d.items() if v is not None]


def _ns(step: dict[str, Any], index: int) -> int:
    ts = step.get("timestamp")
    if isinstance(ts, str):
        try:
            return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1_000_000) * 1000
        except ValueError:
            pass
    return _BASE_NS + index * _STEP_NS


def _output(step: dict[str, Any]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if step.get("reasoning_content"):
        parts.append({"type": "reasoning", "content": step["reasoning_content"]})
    if step.get("message"):
        parts.append({"type": "text", "content": step["message"]})
    parts += [{"type": "tool_call", "id": t.get("tool_call_id"), "name": t.get("function_name"),
               "arguments": t.get("arguments")} for t in step.get("tool_calls") or ()]
    return [{"role": "assistant", "parts": parts}]


def _span(trace: str, span_id: str, parent: str | None, name: str, kind: str, start: int, end: int,
          attrs: dict[str, Any], error: bool = False) -> dict[str, Any]:
    span = {"traceId": trace, "spanId": span_id, "name": name, "kind": _KIND[kind], "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(end), "attributes": _attrs(attrs), "status": {"code": 2} if error else {}}
    if parent:
        span["parentSpanId"] = parent
    return span


def _call_span(traj: dict[str, Any], step: dict[str, Any], conversation: list[dict[str, Any]],
               ids: tuple[str, str, str], start: int) -> dict[str, Any]:
    trace, span_id, parent = ids
    metrics, own = step.get("metrics") or {}, (step.get("extra") or {}).get("spanrl") or {}
    attrs: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.GEN_AI_REQUEST_MODEL: step.get("model_name"),
        sc.GEN_AI_RESPONSE_ID: own.get("response_id") or f"atif-{traj['session_id']}-{step.get('step_id')}",
        sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(_output(step)), sc.POLICY_VERSION: own.get("policy_version"),
    }
    with_ids = metrics.get("completion_token_ids") is not None
    if with_ids:  # the policy server's shape: exact tokens, no messages needed
        attrs.update({sc.LLM_PROMPT_TOKEN_IDS: metrics.get("prompt_token_ids"),
                      sc.LLM_COMPLETION_TOKEN_IDS: metrics["completion_token_ids"],
                      sc.LLM_LOGPROBS: [float(x) for x in metrics.get("logprobs") or ()] or None,
                      sc.LLM_LOGPROBS_TEMPERATURE: own.get("temperature")})
    else:
        attrs[sc.GEN_AI_INPUT_MESSAGES] = json.dumps(conversation)
    return _span(trace, span_id, parent, f"chat {step.get('model_name') or ''}".strip(),
                 "SERVER" if with_ids else "CLIENT", start, start + 1000, attrs,
                 error=own.get("status_code") == "ERROR")


def _reward_times(calls: list[tuple[int, int]], rewards: list[dict[str, Any]], fallback: Any) -> list[tuple]:
    """``(time_ns, name, value)`` per reward: just after the call of its step (-1: before every call)."""
    if not rewards and isinstance(fallback, (int, float)) and not isinstance(fallback, bool):
        rewards = [{"name": sc.DEFAULT_REWARD_NAME, "value": float(fallback), "step": len(calls) - 1}]
    out = []
    for i, r in enumerate(rewards):
        step = r.get("step") if isinstance(r.get("step"), int) else len(calls) - 1
        at = calls[step][1] + 1 + i if 0 <= step < len(calls) else (calls[0][0] - 1 - i if calls else _BASE_NS)
        out.append((at, r.get("name") or sc.DEFAULT_REWARD_NAME, r.get("value")))
    return out


def atif_requests(traj: dict[str, Any]) -> list[dict[str, Any]]:
    """``traj`` as OTLP/JSON ExportTraceServiceRequests (one), its ids derived from its session id."""
    sid = traj["session_id"]
    own = (traj.get("extra") or {}).get("spanrl") or {}
    trace, root = _id(32, sid), _id(16, sid, "rollout")
    spans: list[dict[str, Any]] = []
    agents: dict[str, str] = {}
    conversation: list[dict[str, Any]] = []
    calls: list[tuple[int, int]] = []
    for index, step in enumerate(traj["steps"]):
        if not isinstance(step, dict):
            raise ConfigError(f"trajectory {sid!r}: steps[{index}] must be an object, got {str(step)[:60]!r}")
        source = step.get("source")
        if source in ("system", "user"):
            conversation.append({"role": source, "parts": [{"type": "text", "content": step.get("message", "")}]})
            continue
        if source != "agent":
            raise ConfigError(f"trajectory {sid!r}: steps[{index}].source must be one of system, user, agent; "
                              f"got {source!r}")
        agent = ((step.get("extra") or {}).get("spanrl") or {}).get("agent")
        parent = root
        if agent:
            parent = agents.setdefault(agent, _id(16, sid, "agent", agent))
        start = _ns(step, index)
        spans.append(_call_span(traj, step, conversation, (trace, _id(16, sid, "step", index), parent), start))
        calls.append((start, start + 1000))
        conversation = [*conversation, *_output(step)]
        for result in (step.get("observation") or {}).get("results") or ():
            conversation.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": result.get(
                "source_call_id"), "response": result.get("content")}]})
    first = min((c[0] for c in calls), default=_BASE_NS) - 1_000_000
    last = max((c[1] for c in calls), default=_BASE_NS) + 1_000_000
    for name, span_id in agents.items():
        spans.append(_span(trace, span_id, root, f"invoke_agent {name}", "INTERNAL", first, last,
                           {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: name}))
    for i, (at, name, value) in enumerate(_reward_times(calls, own.get("rewards") or [],
                                                        (traj.get("extra") or {}).get("reward"))):
        spans.append(_span(trace, _id(16, sid, "reward", i), root, sc.REWARD_SPAN_NAME, "INTERNAL", at, at,
                           {sc.REWARD_VALUE: value, sc.REWARD_NAME: name}))
    spans.append(_span(trace, root, None, sc.ROLLOUT_SPAN_NAME, "INTERNAL", first, last + 1_000_000, {},
                       error=own.get("status") == "error"))
    rollout_id = own.get("rollout_id") or sid
    if rollout_id.startswith(sc.DERIVED_ROLLOUT_PREFIXES):  # an id the store derives: no span may name it
        rollout_id = sc.IMPORTED_ROLLOUT_PREFIX + rollout_id
    resource = {sc.SERVICE_NAME: (traj.get("agent") or {}).get("name") or "atif", sc.ROLLOUT_ID: rollout_id,
                sc.TASK_ID: own.get("task_id"), sc.ATTEMPT: own.get("attempt"), sc.MODE: own.get("mode")}
    return [{"resourceSpans": [{"resource": {"attributes": _attrs(resource)},
                                "scopeSpans": [{"scope": {"name": "spanrl.atif"}, "spans": spans}]}]}]

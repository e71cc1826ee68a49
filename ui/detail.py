"""One rollout: its spans (for the waterfall), its LLM calls in order with messages, tokens and
log-probs (from the decomposer, which pairs client and server spans), and its rewards at their step."""

from __future__ import annotations

import json
from typing import Any

from spanrl import semconv
from spanrl.errors import StoreError
from spanrl.ui.source import Source
from spanrl.ui.subset import Scratch, fetch_spans
from spanrl.ui.tokens import TokenText

__all__ = ["MAX_SPANS", "RolloutNotFoundError", "rollout_detail"]


class RolloutNotFoundError(StoreError):
    """No span of the asked rollout is stored."""


MAX_SPANS = 3000
"""Spans sent to the waterfall; a rollout with more shows the first ones by start time."""

_SPAN_FIELDS = ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status_code",
                "status_message", "service_name", "agent_name", "operation_name", "policy_version",
                "reward_value", "reward_name", "attributes", "events")


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _text(value: Any) -> str | None:
    """An attribute that held JSON text arrives parsed (``_json``) or as text: text either way."""
    return value if value is None or isinstance(value, str) else json.dumps(value)


def rollout_detail(source: Source, scratch: Scratch, rollout_id: str, tokens: TokenText) -> dict[str, Any]:
    """Everything the rollout page shows except credit (see `spanrl.ui.credit`). `StoreError` when
    no span of the rollout is stored."""
    table = fetch_spans(source, [rollout_id])
    if table.num_rows == 0:
        raise RolloutNotFoundError(f"no spans of rollout {rollout_id!r} are stored")
    dec = scratch.decompose_rollout(table, rollout_id)
    truncated = table.num_rows > MAX_SPANS
    spans = table.slice(0, MAX_SPANS).select(list(_SPAN_FIELDS)).to_pylist()
    for span in spans:
        span["attributes"] = _json(span["attributes"])
        span["events"] = _json(span["events"])
    by_id = {s["span_id"]: s for s in spans}
    calls = [_call(row, by_id, tokens) for row in dec.calls.to_pylist()]
    rollout = dec.rollouts.to_pylist()[0] if dec.rollouts.num_rows else {"rollout_id": rollout_id}
    return {
        "rollout": rollout,
        "spans": spans,
        "spans_truncated": truncated,
        "calls": calls,
        "rewards": dec.rewards.to_pylist(),
        "report": dec.report,
    }


def _call(row: dict[str, Any], spans: dict[str, dict[str, Any]], tokens: TokenText) -> dict[str, Any]:
    client = spans.get(row.get("client_span_id") or "")
    server = spans.get(row.get("server_span_id") or "")
    timed = client or server
    attrs = (client or {}).get("attributes") or (server or {}).get("attributes") or {}
    completion = row["completion_ids"]
    return {
        "step": row["step"],
        "agent": row["agent"],
        "policy_version": row["policy_version"],
        "status_code": row["status_code"],
        "response_id": row["response_id"],
        "client_span_id": row["client_span_id"],
        "server_span_id": row["server_span_id"],
        "model": attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model"),
        "adapter": ((server or {}).get("attributes") or {}).get(semconv.POLICY_ADAPTER),  # per-agent policies
        "latency_ms": (timed["end_ns"] - timed["start_ns"]) / 1e6 if timed else None,
        "server_latency_ms": (server["end_ns"] - server["start_ns"]) / 1e6 if server else None,
        "input_tokens": (
            len(row["prompt_ids"]) if row["prompt_ids"] is not None else attrs.get("gen_ai.usage.input_tokens")
        ),

        "output_tokens": len(completion) if completion is not None else attrs.get("gen_ai.usage.output_tokens"),
        # the decomposer keeps messages only for calls it may retokenize; the client span has them all
        "input_messages": _json(row["input_messages"] or _text(attrs.get("gen_ai.input.messages"))),
        "output_messages": _json(row["output_messages"] or _text(attrs.get("gen_ai.output.messages"))),
        "completion_ids": completion,
        "completion_text": tokens.pieces(completion) if completion is not None else None,
        "logprobs": row["logprobs"],
        "rewards_after": row["rewards_after"],
    }

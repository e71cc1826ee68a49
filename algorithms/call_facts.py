"""What the environment recorded about each LLM call besides its tokens: the state it observed
(``spanrl.state.id``, GiGPO's anchor state), its ground-truth label (``spanrl.label.good``, the credit
audit's) and the messages it was sent. Read from the store by span id, apart from the decomposer:
only GiGPO's step groups and the audit need them.

A call's span is its agent's client span and the policy server's span (either may be missing). A label
may also sit on any other span of the rollout that names the call by ``gen_ai.response.id`` (the agent
knows whether a reply was good only after the call's span has ended). The state
a tool span carries is the state its result left the agent in: it is the state of the first call that
started after the tool span ended, when that call started after the previous call of the rollout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from spanrl import semconv as sc
from spanrl.store.decomposer import run_query

__all__ = ["ID_COLUMNS", "CallFacts", "call_facts"]

ID_COLUMNS = ("client_trace_id", "client_span_id", "server_trace_id", "server_span_id", "response_id")
"""The decomposer's call columns `call_facts` needs, besides ``rollout_id`` and ``step``."""

_SPANS_SQL = f"""
WITH wanted AS (SELECT unnest($traces) AS trace_id, unnest($spans) AS span_id, unnest($rows) AS row)
SELECT w.row, min(s.start_ns) AS start_ns,
       max(s.attributes ->> '$."{sc.STATE_ID}"') AS state_id,
       max(s.attributes ->> '$."{sc.LABEL_GOOD}"') AS label,
       max(s.attributes ->> '$."{sc.GEN_AI_INPUT_MESSAGES}"') AS input_messages
FROM wanted w JOIN spans s ON s.trace_id = w.trace_id AND s.span_id = w.span_id
GROUP BY w.row
"""
_LABELS_SQL = f"""
SELECT rollout_id, response_id, max(attributes ->> '$."{sc.LABEL_GOOD}"') AS label
FROM rollout_spans(0)
WHERE list_contains($rollouts, rollout_id) AND list_contains($responses, response_id)
  AND attributes ->> '$."{sc.LABEL_GOOD}"' IS NOT NULL
GROUP BY rollout_id, response_id
"""
_TOOL_STATES_SQL = f"""
SELECT rollout_id, end_ns, attributes ->> '$."{sc.STATE_ID}"' AS state_id
FROM rollout_spans(0)
WHERE operation_name = '{sc.OP_EXECUTE_TOOL}' AND list_contains($rollouts, rollout_id)
  AND attributes ->> '$."{sc.STATE_ID}"' IS NOT NULL
ORDER BY rollout_id, end_ns
"""


class CallFacts:
    """Per call, in the order of the calls given: ``state`` (the ``spanrl.state.id`` found, or None),
    ``label`` (True / False / None: unlabelled) and ``messages`` (the client span's input messages JSON)."""

    def __init__(self, state: list[str | None], label: list[bool | None], messages: list[str | None]) -> None:
        self.state, self.label, self.messages = state, label, messages


def _sql(store: Any, query: str, params: dict[str, Any]) -> pa.Table:
    return run_query(store, query, params, what="reading the calls' states and labels")


def _label(text: str | None) -> bool | None:
    return {"true": True, "false": False}.get(str(text).lower()) if text is not None else None


def call_facts(store: Any, calls: pa.Table, *, tool_states: bool = True) -> CallFacts:
    """The facts of ``calls`` (columns ``rollout_id``, ``step`` and `ID_COLUMNS`, as ``decompose`` gives them);
    ``tool_states`` False: states from the calls' own spans only (labels alone need no tool spans)."""
    cols = _columns(calls)
    state, label, messages, start = _own_spans(store, cols)
    _labels_by_response(store, cols["rollout_id"], cols["response_id"], label)
    if tool_states:
        previous = _previous_starts(store, cols, start, state)
        _tool_states(store, cols["rollout_id"], cols["step"], start, previous, state)
    return CallFacts(state, label, messages)


def _columns(calls: pa.Table) -> dict[str, list[Any]]:
    return {c: calls.column(c).to_pylist() for c in ("rollout_id", "step", *ID_COLUMNS)}


def _own_spans(store: Any, cols: dict[str, list[Any]]) -> tuple[list[Any], list[Any], list[Any], np.ndarray]:
    """Per call, from its client span, else its server span: the state, the label, the input messages and the
    start (the earlier span's; the int64 minimum when neither span is stored)."""
    n = len(cols["rollout_id"])
    traces, spans, rows = [], [], []
    for side, offset in (("client", 0), ("server", n)):  # rows [0, n): client spans; [n, 2n): server spans
        for i, (t, s) in enumerate(zip(cols[f"{side}_trace_id"], cols[f"{side}_span_id"])):
            if t is not None and s is not None:
                traces.append(t), spans.append(s), rows.append(offset + i)
    found = _sql(store, _SPANS_SQL, {"traces": traces, "spans": spans, "rows": rows}).to_pylist() if rows else []
    by_row = {r["row"]: r for r in found}
    state: list[str | None] = [None] * n
    label: list[bool | None] = [None] * n
    messages: list[str | None] = [None] * n
    start = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    for i in range(n):
        client, server = by_row.get(i, {}), by_row.get(n + i, {})
        state[i] = client.get("state_id") or server.get("state_id")
        label[i] = _label(client.get("label") if client.get("label") is not None else server.get("label"))
        messages[i] = client.get("input_messages") or server.get("input_messages")
        first = client.get("start_ns") if client.get("start_ns") is not None else server.get("start_ns")
        if first is not None:
            start[i] = first
    return state, label, messages, start


def _previous_starts(store: Any, cols: dict[str, list[Any]], start: np.ndarray,
                     state: list[str | None]) -> dict[tuple[str, int], int]:
    """Each call's start by ``(rollout_id, step)``, for the given calls and, where a selection (``agents``,
    ``min_policy_version``, an unusable call dropped) left out the predecessor of a call still without a state,
    for every call of its rollout: a tool span that ended before the previous call started is that call's,
    never a later one's."""
    starts = {(r, s): int(t) for r, s, t in zip(cols["rollout_id"], cols["step"], start)}
    gaps = sorted({r for r, s, known in zip(cols["rollout_id"], cols["step"], state)
                   if known is None and s > 0 and (r, s - 1) not in starts})
    if gaps:
        from spanrl.store.decomposer import Selection, decompose

        every = decompose(store, Selection(rollout_ids=gaps), call_columns=("rollout_id", "step", *ID_COLUMNS)).calls
        every_cols = _columns(every)
        every_start = _own_spans(store, every_cols)[3]
        for r, s, t in zip(every_cols["rollout_id"], every_cols["step"], every_start):
            starts.setdefault((r, s), int(t))
    return starts


def _labels_by_response(store: Any, rollout: list[str], response: list[str | None],
                        label: list[bool | None]) -> None:
    """Fill ``label`` of the calls without one from a span of the same rollout naming the call's response id."""
    todo = [i for i, lab in enumerate(label) if lab is None and response[i] is not None]
    if not todo:
        return
    params = {"rollouts": sorted({rollout[i] for i in todo}), "responses": sorted({response[i] for i in todo})}
    found = {(r["rollout_id"], r["response_id"]): r["label"] for r in _sql(store, _LABELS_SQL, params).to_pylist()}
    for i in todo:
        label[i] = _label(found.get((rollout[i], response[i])))


def _tool_states(store: Any, rollout: list[str], step: list[int], start: np.ndarray,
                 previous: dict[tuple[str, int], int], state: list[str | None]) -> None:
    """Fill ``state`` of the calls without one from the last tool span with a state that ended after the
    previous call of the rollout started and before this call started."""
    todo = [i for i, s in enumerate(state) if s is None]
    if not todo:
        return
    tools = _sql(store, _TOOL_STATES_SQL, {"rollouts": sorted({rollout[i] for i in todo})}).to_pylist()
    by_rollout: dict[str, list[tuple[int, str]]] = {}
    for t in tools:
        by_rollout.setdefault(t["rollout_id"], []).append((t["end_ns"], t["state_id"]))
    for i in todo:
        since = previous.get((rollout[i], step[i] - 1), np.iinfo(np.int64).min)
        seen = [sid for end, sid in by_rollout.get(rollout[i], ()) if since < end <= start[i]]
        if seen:
            state[i] = seen[-1]

"""Step facts: what the trace says went wrong at each LLM call, read from its tool spans (the ``tool_calls``
view, store/views.sql), so an agent that imports no spanrl (plain OTel GenAI tool spans) gets them too.

A tool span (``gen_ai.operation.name`` = ``execute_tool``) belongs to the LLM call that issued it, first found:

1. the call of the same rollout whose output messages hold a tool call with the span's ``gen_ai.tool.call.id``
   (a ``tool_call`` part's ``id``, or an OpenAI-style ``tool_calls[].id``; the messages of the call's client
   span, else its policy server span: the attribute, else the inference-details event, else the decomposer's
   ``output_messages`` when given, which resolves ``*_ref`` content); when several calls name that id
   (some models number their calls per turn), the last of them that ended at or before the tool span started;
2. else the last call of the rollout that ended at or before the tool span started (agent clock: the call's
   client span end, ``agent_end_ns``);
3. else none: step ``-1`` (a tool span before every call; credits no call, as a reward there).

A denied call may have no tool span (semantic-conventions-genai: the ``gen_ai.tool.call.decision`` event "without
producing an execute_tool span"): a decision event off the tool spans (the ``tool_decisions`` view) whose call id
no tool span of the rollout has is a tool call of its own when its last decision is ``deny`` (each id-less one
alone), given to its call as a tool span is, with one more rule between 1 and 2: the event recorded on an LLM
call's own span (client or server) is that call's.

Each tool span counts under at most one outcome, the first that holds: ``denied`` (its last decision is ``deny``,
``tool_calls.decision``: it never ran), ``nonzero_exit`` (a command tool's ``process.exit.code`` is not 0;
its ERROR status and ``error.type`` say the same thing and are not counted again), ``tool_error`` (status ERROR
or an ``error.type``). Besides, ``retry``: the tool span repeats an earlier tool span of the same rollout (by start
time) with the same ``gen_ai.tool.name`` and the same ``gen_ai.tool.call.arguments`` (the same text once JSON
whitespace is removed; a span without arguments is never a retry): the call that issued the repeat wasted a step.
A tool span exported twice counts once. An LLM call retried after an error is no fact: the failed call generated
no tokens, so it is no step the policy took (docs/credit.md).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = ["CALL_COLUMNS", "FACTS", "step_facts", "tool_call_ids"]

FACTS = ("tool_error", "nonzero_exit", "denied", "retry")
"""The facts counted per call (module docstring), in the order the viewer and the report show them."""

CALL_COLUMNS = ("rollout_id", "step", "agent_end_ns", "client_trace_id", "client_span_id", "server_trace_id",
                "server_span_id")
"""The decomposer's call columns `step_facts` reads (``output_messages`` too, when the caller has it)."""

_OUTPUTS_SQL = """
WITH wanted AS (SELECT unnest($traces) AS trace_id, unnest($spans) AS span_id, unnest($rows) AS row)
SELECT w.row, coalesce(s.attributes ->> '$."gen_ai.output.messages"',
                       event_attributes(s.events, 'gen_ai.client.inference.operation.details')
                           ->> '$."gen_ai.output.messages"', l.output) AS output
FROM wanted w JOIN spans s ON s.trace_id = w.trace_id AND s.span_id = w.span_id
LEFT JOIN (SELECT trace_id, span_id, any_value(attributes ->> '$."gen_ai.output.messages"') AS output
           FROM logged_events('gen_ai.client.inference.operation.details') GROUP BY ALL) l
    ON l.trace_id = s.trace_id AND l.span_id = s.span_id
"""
_SQL = f"""
WITH calls AS (
    SELECT unnest($rollouts::VARCHAR[]) AS rollout_id, unnest($steps::BIGINT[]) AS step,
           unnest($ends::BIGINT[]) AS end_ns, unnest($spans::VARCHAR[][]) AS span_key
), ids AS (
    SELECT unnest($id_rollouts::VARCHAR[]) AS rollout_id, unnest($id_steps::BIGINT[]) AS step,
           unnest($ids::VARCHAR[]) AS tool_call_id
), tool_spans AS (  -- the tool spans (a span exported twice counts once)
    SELECT DISTINCT ON (trace_id, span_id) trace_id || span_id AS key, NULL::VARCHAR AS span_key, rollout_id, start_ns,
           tool_call_id, tool_name,
           CASE WHEN json_valid(arguments) THEN json(arguments)::VARCHAR ELSE arguments END AS arguments,
           CASE WHEN decision = 'deny' THEN 'denied'
                WHEN exit_code <> 0 THEN 'nonzero_exit'
                WHEN status_code = 'ERROR' OR error_type IS NOT NULL THEN 'tool_error' END AS outcome
    FROM tool_calls
    WHERE list_contains($rollout_set::VARCHAR[], rollout_id)
    ORDER BY trace_id, span_id, start_ns
), spanless AS (  -- decision events off tool spans: the last one on each call id (each id-less one alone)
    SELECT DISTINCT ON (rollout_id, coalesce(tool_call_id, trace_id || span_id || time_ns)) *
    FROM tool_decisions d
    WHERE list_contains($rollout_set::VARCHAR[], rollout_id) AND NOT on_tool_span
      AND (tool_call_id IS NULL
           OR NOT EXISTS (SELECT 1 FROM tool_spans t
                          WHERE t.rollout_id = d.rollout_id AND t.tool_call_id = d.tool_call_id))
    ORDER BY rollout_id, coalesce(tool_call_id, trace_id || span_id || time_ns), time_ns DESC
), tools AS (  -- the tool spans, and the denied calls that have none (they never ran)
    SELECT * FROM tool_spans
    UNION ALL
    SELECT 'decision:' || trace_id || span_id || coalesce(tool_call_id, time_ns::VARCHAR), trace_id || span_id,
           rollout_id, time_ns, tool_call_id, tool_name, NULL, 'denied'
    FROM spanless
    WHERE outcome = 'deny'
), ranked AS (
    SELECT *, arguments IS NOT NULL
              AND row_number() OVER (PARTITION BY rollout_id, tool_name, arguments ORDER BY start_ns, key) > 1
              AS retry
    FROM tools
), by_id AS (
    SELECT t.key, coalesce(arg_max(c.step, c.end_ns) FILTER (WHERE c.end_ns <= t.start_ns), min(c.step)) AS step
    FROM tools t
    JOIN ids i ON i.rollout_id = t.rollout_id AND i.tool_call_id = t.tool_call_id
    JOIN calls c ON c.rollout_id = i.rollout_id AND c.step = i.step
    GROUP BY t.key
), by_span AS (  -- a decision recorded on the LLM call's own span (client or server)
    SELECT t.key, min(c.step) AS step
    FROM tools t JOIN calls c ON c.rollout_id = t.rollout_id AND list_contains(c.span_key, t.span_key)
    GROUP BY t.key
), by_time AS (
    SELECT t.key, arg_max(c.step, c.end_ns) AS step
    FROM tools t JOIN calls c ON c.rollout_id = t.rollout_id AND c.end_ns <= t.start_ns
    GROUP BY t.key
)
SELECT r.rollout_id, coalesce(bi.step, bs.step, bt.step, -1) AS step, count(*) AS tools,
       {", ".join(f"count(*) FILTER (WHERE r.outcome = '{f}') AS {f}" for f in FACTS if f != "retry")},
       count(*) FILTER (WHERE r.retry) AS retry
FROM ranked r
LEFT JOIN by_id bi USING (key)
LEFT JOIN by_span bs USING (key)
LEFT JOIN by_time bt USING (key)
GROUP BY ALL
ORDER BY r.rollout_id, step
"""


def tool_call_ids(messages: Any) -> list[str]:
    """The ids of the tool calls in output messages (a list, or its JSON text): GenAI ``tool_call`` parts'
    ``id`` and OpenAI-style ``tool_calls[].id``; none when the messages cannot be read."""
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except ValueError:
            return []
    found: list[str] = []
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        parts = [p for p in message.get("parts") or () if isinstance(p, dict) and p.get("type") == "tool_call"]
        calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
        found += [str(c["id"]) for c in parts + calls if c.get("id") is not None]
    return found


def step_facts(con: Any, calls: pa.Table) -> pa.Table:
    """Per (``rollout_id``, ``step``) with tool calls, the counts of `FACTS` and ``tools`` (its tool spans and its
    denied calls without one), step ``-1`` for those before every call (module docstring). ``calls``: the
    decomposer's calls of the rollouts to read, with `CALL_COLUMNS` (every call of a rollout, so that a tool span
    is not given to an earlier call than its own); ``con`` as for ``decompose``."""
    from spanrl.store.decomposer import run_query

    cols = {c: calls.column(c).to_pylist() for c in CALL_COLUMNS}
    outputs = _outputs(con, cols, calls.column("output_messages").to_pylist()
                       if "output_messages" in calls.column_names else [None] * calls.num_rows)
    id_rollouts, id_steps, ids = [], [], []
    for rollout, step, output in zip(cols["rollout_id"], cols["step"], outputs):
        for tool_call_id in tool_call_ids(output):
            id_rollouts.append(rollout), id_steps.append(step), ids.append(tool_call_id)
    spans = [[t + s for t, s in ((ct, cs), (st, ss)) if t is not None and s is not None]
             for ct, cs, st, ss in zip(cols["client_trace_id"], cols["client_span_id"], cols["server_trace_id"],
                                       cols["server_span_id"])]
    params = {"rollouts": cols["rollout_id"], "steps": cols["step"], "ends": cols["agent_end_ns"], "spans": spans,
              "id_rollouts": id_rollouts, "id_steps": id_steps, "ids": ids,
              "rollout_set": sorted(set(cols["rollout_id"]))}
    return run_query(con, _SQL, params, what="reading the calls' tool spans (step facts)")


def _outputs(con: Any, cols: dict[str, list[Any]], given: list[Any]) -> list[Any]:
    """Each call's output messages: its client span's, else its server span's, else ``given``."""
    from spanrl.store.decomposer import run_query

    n = len(given)
    traces, spans, rows = [], [], []
    for side, offset in (("client", 0), ("server", n)):  # rows [0, n): client spans; [n, 2n): server spans
        for i, (t, s) in enumerate(zip(cols[f"{side}_trace_id"], cols[f"{side}_span_id"])):
            if t is not None and s is not None:
                traces.append(t), spans.append(s), rows.append(offset + i)
    found = run_query(con, _OUTPUTS_SQL, {"traces": traces, "spans": spans, "rows": rows},
                      what="reading the calls' output messages (step facts)").to_pylist() if rows else []
    by_row = {r["row"]: r["output"] for r in found if r["output"] is not None}
    return [by_row.get(i, by_row.get(n + i, given[i])) for i in range(n)]

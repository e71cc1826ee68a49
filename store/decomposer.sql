-- The decomposer's statement: store/decomposer.py runs it and splits its rows (what they mean: its docstring).
-- One statement, so it also runs through the collector's SQL endpoint; three kinds of rows told apart by
-- `row_kind`. No ORDER BY: sorting the token arrays in DuckDB cost more than the rest; the decomposer sorts.
--
-- Words in double underscores are placeholders store/decomposer.py fills: at import, the text Python generates
-- (a scan per LLM operation, the agent walk's unrolled levels); per statement, where live reads start, the
-- selection (the rollout filter selects rows of `ro`, the call filter the calls returned) and the light call
-- columns asked for. The rest is fixed text with $parameters. Span names and attributes are spanrl/semconv.py's,
-- spelled out as in views.sql (tests/store/test_decomposer.py checks them); JSON keys with dots are quoted.
WITH RECURSIVE
ro AS (  -- status and end: the one rule, views.sql's rollout_state (attribution: rollout_spans)
    SELECT *, span_count AS span_rows, end_ingested_ns AS rollout_ingested_ns
    FROM rollout_state(__SINCE__)
    WHERE __ROLLOUT_FILTER__
),
-- LLM call spans: light columns only (the id arrays are fetched by rowid at the end)
llm_all AS MATERIALIZED (  -- attributed to a rollout by views.sql's rule (rollout_spans)
    __LLM_SCANS__
),
llm_keys AS (  -- a span exported twice is stored twice: keep the first copy ingested
    SELECT arg_min(rid, ingested_ns) AS rid, count(*) - 1 AS extra_copies
    FROM llm_all
    GROUP BY trace_id, span_id
),
llm AS (
    SELECT * FROM llm_all
    WHERE rid IN (SELECT rid FROM llm_keys) AND rollout_id IN (SELECT rollout_id FROM ro)
),
srv AS (SELECT * FROM llm WHERE kind = 'SERVER'),
cli_all AS (SELECT * FROM llm WHERE kind <> 'SERVER'),
-- Two instrumentors (or a framework span and an instrumentor) record one call as two client spans:
-- the outer one wraps the inner one, and both carry the response id. Keep the inner one (the server
-- span's parent when trace context propagated), then one client span per response id in a rollout.
cli_outer AS (
    SELECT DISTINCT o.rid
    FROM cli_all o JOIN cli_all i ON i.trace_id = o.trace_id AND i.parent_span_id = o.span_id
),
cli_inner AS MATERIALIZED (SELECT * FROM cli_all WHERE rid NOT IN (SELECT rid FROM cli_outer)),
cli AS (  -- per response id: the latest started, then the first stored (a group-by: a window sorted whole rows)
    SELECT * FROM cli_inner
    WHERE response_id IS NULL OR rid IN (
        SELECT arg_max(rid, struct_pack(start_ns := start_ns, first := -rid))
        FROM cli_inner WHERE response_id IS NOT NULL GROUP BY rollout_id, response_id
    )
),
dup_calls AS (
    SELECT rollout_id, count(*) AS n FROM cli_all WHERE rid NOT IN (SELECT rid FROM cli) GROUP BY rollout_id
),
pair AS (  -- each server span with its client span: its parent if that is one, else by response id
    SELECT s.rid AS s_rid, coalesce(cp.rid, cr.rid) AS c_rid
    FROM srv s
    LEFT JOIN cli cp ON cp.trace_id = s.trace_id AND cp.span_id = s.parent_span_id
    LEFT JOIN cli cr ON cp.rid IS NULL AND cr.rollout_id = s.rollout_id AND cr.response_id = s.response_id
    QUALIFY row_number() OVER (PARTITION BY s.rid ORDER BY cr.start_ns NULLS LAST) = 1
),
call0 AS (
    SELECT s.rollout_id, s.rid AS s_rid, c.rid AS c_rid,
           s.trace_id AS s_trace, s.span_id AS s_span, c.trace_id AS c_trace, c.span_id AS c_span,
           s.start_ns AS s_start, s.end_ns AS s_end, c.start_ns AS c_start, c.end_ns AS c_end,
           c.service_name AS c_service, coalesce(s.response_id, c.response_id) AS response_id,
           s.policy_version, coalesce(s.status_code, c.status_code) AS status_code, s.has_ids,
           greatest(s.ingested_ns, c.ingested_ns) AS ingested_ns,
           coalesce(c.trace_id, s.trace_id) AS w_trace, coalesce(c.span_id, s.span_id) AS w_span,
           CASE WHEN c.rid IS NOT NULL THEN c.parent_span_id ELSE s.parent_span_id END AS w_parent
    FROM srv s
    JOIN pair p ON p.s_rid = s.rid
    LEFT JOIN cli c ON c.rid = p.c_rid
    UNION ALL BY NAME
    SELECT c.rollout_id, c.rid AS c_rid, c.trace_id AS c_trace, c.span_id AS c_span,
           c.start_ns AS c_start, c.end_ns AS c_end, c.service_name AS c_service, c.response_id, c.status_code,
           FALSE AS has_ids, c.ingested_ns,
           c.trace_id AS w_trace, c.span_id AS w_span, c.parent_span_id AS w_parent
    FROM cli c
    WHERE c.rid NOT IN (SELECT c_rid FROM pair WHERE c_rid IS NOT NULL)
),
skew_service AS (
    SELECT rollout_id, c_service, median(s_start - c_start)::BIGINT AS offset_ns
    FROM call0 WHERE s_start IS NOT NULL AND c_start IS NOT NULL
    GROUP BY ALL
),
skew_rollout AS (
    SELECT rollout_id, median(s_start - c_start)::BIGINT AS offset_ns
    FROM call0 WHERE s_start IS NOT NULL AND c_start IS NOT NULL
    GROUP BY ALL
),
call1 AS (
    SELECT c.*,
           coalesce(ks.offset_ns, kr.offset_ns, 0) AS offset_ns,
           coalesce(c.s_start, c.c_start + coalesce(ks.offset_ns, kr.offset_ns, 0)) AS order_ns,
           coalesce(c.c_end, c.s_end - coalesce(kr.offset_ns, 0)) AS agent_end_ns
    FROM call0 c
    LEFT JOIN skew_service ks ON ks.rollout_id = c.rollout_id AND ks.c_service IS NOT DISTINCT FROM c.c_service
    LEFT JOIN skew_rollout kr ON kr.rollout_id = c.rollout_id
),
calls AS (
    SELECT *,
           (row_number() OVER (PARTITION BY rollout_id ORDER BY order_ns, coalesce(s_span, c_span)) - 1)::INTEGER
               AS step,
           (count(*) OVER (PARTITION BY rollout_id))::INTEGER AS rollout_calls,
           hash(w_trace, w_span) AS w_key
    FROM call1
),
-- the agent: nearest invoke_agent ancestor, walking parent links (hashed (trace, span) keys). The first
-- levels are plain joins (DuckDB hashes the smaller side, the walk); a recursive CTE rebuilds its join's
-- hash table of the whole tree on every pass, so only chains longer than that recurse, over their traces.
tree AS MATERIALIZED (
    SELECT __TREE_COLUMNS__
    FROM spans
    WHERE trace_id IN (SELECT w_trace FROM calls)
),
walk_1 AS MATERIALIZED (
    SELECT w_key, w_trace, hash(w_trace, w_parent) AS next_k, 1 AS depth, NULL::VARCHAR AS agent, FALSE AS broken
    FROM calls WHERE w_parent IS NOT NULL
),
__WALK_LEVELS__
deep_tree AS MATERIALIZED (
    SELECT __TREE_COLUMNS__
    FROM spans
    WHERE trace_id IN (SELECT w_trace FROM __DEEPEST_WALK__ WHERE agent IS NULL AND next_k IS NOT NULL)
),
walk_deep(w_key, w_trace, next_k, depth, agent, broken) AS (
    SELECT * FROM __DEEPEST_WALK__ WHERE agent IS NULL AND next_k IS NOT NULL
    UNION ALL
    SELECT w.w_key, w.w_trace, t.pk, w.depth + 1, t.agent, t.k IS NULL
    FROM walk_deep w LEFT JOIN deep_tree t ON t.k = w.next_k
    WHERE w.agent IS NULL AND w.next_k IS NOT NULL AND w.depth < __MAX_ANCESTOR_DEPTH__
),
agents AS (
    SELECT w_key, arg_min(agent, depth) FILTER (WHERE agent IS NOT NULL) AS agent, bool_or(broken) AS broken
    FROM (__WALK_UNION__) GROUP BY w_key
),
-- rewards: span attributes and events, one row each, placed after the last call that ended before them
rw0 AS MATERIALIZED (  -- resolved to their rollouts by views.sql's one rule (rollout_rewards)
    SELECT trace_id, span_id, rid AS copy_rid, rollout_id, time_ns, ingested_ns, name,
           usable_reward(value) AS value, source  -- unusable: NaN
    FROM rollout_rewards(__SINCE__, usable_only := FALSE)
    UNION ALL  -- a reward span without a value: NaN
    SELECT trace_id, span_id, rid AS copy_rid, rollout_id, end_ns AS time_ns, ingested_ns,
           coalesce(reward_name, 'reward') AS name, 'NaN'::DOUBLE AS value, 'span' AS source
    FROM rollout_spans(__SINCE__)
    WHERE reward_value IS NULL AND name = 'spanrl.reward'
),
rw_copy AS (  -- a span exported twice is stored twice: its rewards come from the first copy ingested
    SELECT trace_id, span_id, arg_min(copy_rid, ingested_ns) AS first_rid
    FROM rw0 GROUP BY trace_id, span_id
),
rw_dup AS (  -- each event of the kept copy is a reward of its own, even with the same name and value as
             -- another; the span's attribute value is the same reward as an event repeating it on that span
    SELECT r.*,
           r.copy_rid <> k.first_rid
           OR (r.source = 'span' AND bool_or(r.source = 'event') OVER (PARTITION BY r.copy_rid, r.name, r.value))
           AS duplicate
    FROM rw0 r
    JOIN rw_copy k ON k.trace_id = r.trace_id AND k.span_id = r.span_id
    WHERE r.rollout_id IN (SELECT rollout_id FROM ro)
),
rw AS (SELECT * EXCLUDE (duplicate, copy_rid) FROM rw_dup WHERE NOT duplicate),
dups AS (
    SELECT rollout_id, sum(n) AS n FROM (
        SELECT l.rollout_id, k.extra_copies AS n FROM llm l JOIN llm_keys k USING (rid) WHERE k.extra_copies > 0
        UNION ALL
        SELECT rollout_id, count(DISTINCT copy_rid) AS n FROM rw_dup WHERE duplicate GROUP BY rollout_id
    ) GROUP BY rollout_id
),
lates AS (
    SELECT rollout_id, count(*) AS n FROM (
        SELECT c.rollout_id, c.ingested_ns FROM calls c UNION ALL SELECT r.rollout_id, r.ingested_ns FROM rw r
    ) x JOIN ro USING (rollout_id)
    WHERE x.ingested_ns > ro.rollout_ingested_ns
    GROUP BY rollout_id
),
orphans AS (
    SELECT c.rollout_id, count(*) AS n FROM calls c JOIN agents a USING (w_key) WHERE a.broken GROUP BY c.rollout_id
),
rw_step AS MATERIALIZED (  -- each reward with the step of the last call that ended before it (agent clock)
    SELECT rw.*, coalesce(c.step, -1)::INTEGER AS step
    FROM rw ASOF LEFT JOIN (SELECT rollout_id, agent_end_ns, step FROM calls) c
        ON c.rollout_id = rw.rollout_id AND rw.time_ns >= c.agent_end_ns
),
step_rewards AS (  -- per call: the rewards that followed it (before the next call), summed by name
    SELECT rollout_id, step, map(list(name ORDER BY name), list(total ORDER BY name)) AS rewards_after
    FROM (SELECT rollout_id, step, name, sum(value) AS total FROM rw_step WHERE step >= 0 GROUP BY ALL)
    GROUP BY rollout_id, step
),
out_calls AS MATERIALIZED (  -- light columns; the arrays are joined last, probing with a scan of spans
    SELECT c.has_ids, c.s_rid, c.c_rid, __OUT_CALL_COLUMNS__
    FROM calls c
    JOIN ro ON ro.rollout_id = c.rollout_id
    LEFT JOIN agents a ON a.w_key = c.w_key
    __STEP_REWARDS_JOIN__
    WHERE __CALL_FILTER__
)
-- the call rows, in two branches with the same columns: the light ones (out_calls f), the server span's (sx)
-- arrays and the temperature its log-probs were computed at
SELECT 'call' AS row_kind, f.* EXCLUDE (s_rid, c_rid, has_ids),
       sx.prompt_token_ids AS prompt_ids, sx.completion_token_ids AS completion_ids, sx.logprobs,
       coalesce(TRY_CAST(sx.attributes ->> '$."spanrl.llm.logprobs_temperature"' AS DOUBLE),
                nullif(TRY_CAST(sx.attributes ->> '$."gen_ai.request.temperature"' AS DOUBLE), 0.0)) AS temperature
FROM out_calls f
LEFT JOIN spans sx ON sx.rowid = f.s_rid
WHERE f.has_ids
UNION ALL BY NAME  -- calls without ids apart: only they join their client span's messages
-- Messages: the span's attributes, else its gen_ai.client.inference.operation.details event's; the system
-- instructions, content kept elsewhere (*_ref URIs) and the upload's gen_ai.content.storage.result events
-- go to store/messages.py in `message_sources`. An event may be a span event or a log record emitted in the span
-- (views.sql, logged_events).
SELECT 'call' AS row_kind, f.* EXCLUDE (s_rid, c_rid, has_ids),
       sx.prompt_token_ids AS prompt_ids, sx.completion_token_ids AS completion_ids, sx.logprobs,
       coalesce(TRY_CAST(sx.attributes ->> '$."spanrl.llm.logprobs_temperature"' AS DOUBLE),
                nullif(TRY_CAST(sx.attributes ->> '$."gen_ai.request.temperature"' AS DOUBLE), 0.0)) AS temperature,
       coalesce(cx.a ->> '$."gen_ai.input.messages"', cx.d ->> '$."gen_ai.input.messages"') AS input_messages,
       coalesce(cx.a ->> '$."gen_ai.output.messages"', cx.d ->> '$."gen_ai.output.messages"') AS output_messages,
       nullif(json_object(
           'system_instructions', coalesce(cx.a -> '$."gen_ai.system_instructions"',
                                           cx.d -> '$."gen_ai.system_instructions"'),
           'input_messages_ref', coalesce(cx.a ->> '$."gen_ai.input.messages_ref"',
                                          cx.d ->> '$."gen_ai.input.messages_ref"'),
           'output_messages_ref', coalesce(cx.a ->> '$."gen_ai.output.messages_ref"',
                                           cx.d ->> '$."gen_ai.output.messages_ref"'),
           'system_instructions_ref', coalesce(cx.a ->> '$."gen_ai.system_instructions_ref"',
                                               cx.d ->> '$."gen_ai.system_instructions_ref"'),
           'storage', cx.storage)::VARCHAR,
           '{"system_instructions":null,"input_messages_ref":null,"output_messages_ref":null,'
           || '"system_instructions_ref":null,"storage":null}') AS message_sources
FROM out_calls f
LEFT JOIN spans sx ON sx.rowid = f.s_rid
LEFT JOIN (
    SELECT c.rowid AS rid, c.attributes AS a,
           coalesce(CASE WHEN contains(c.events, 'gen_ai.client.inference.operation.details') THEN list_filter(
               from_json(c.events, '[{"name": "VARCHAR", "attributes": "JSON"}]'),
               lambda e: e.name = 'gen_ai.client.inference.operation.details')[1].attributes END, ld.a) AS d,
           nullif(list_concat(
               CASE WHEN contains(c.events, 'gen_ai.content.storage.result') THEN list_transform(list_filter(
                   from_json(c.events, '[{"name": "VARCHAR", "attributes": "JSON"}]'),
                   lambda e: e.name = 'gen_ai.content.storage.result'), lambda e: e.attributes) END, ls.a), [])
               AS storage
    FROM spans c
    LEFT JOIN (SELECT trace_id, span_id, any_value(attributes) AS a
               FROM logged_events('gen_ai.client.inference.operation.details') GROUP BY ALL) ld
        ON ld.trace_id = c.trace_id AND ld.span_id = c.span_id
    LEFT JOIN (SELECT trace_id, span_id, list(attributes ORDER BY time_ns) AS a
               FROM logged_events('gen_ai.content.storage.result') GROUP BY ALL) ls
        ON ls.trace_id = c.trace_id AND ls.span_id = c.span_id
    WHERE c.rowid IN (SELECT c_rid FROM out_calls WHERE NOT has_ids)
) cx ON cx.rid = f.c_rid
WHERE NOT f.has_ids
UNION ALL BY NAME
SELECT 'reward' AS row_kind, rw.rollout_id, rw.name, rw.value, rw.time_ns, rw.source, rw.step,
       coalesce(n.rollout_calls, 0)::INTEGER AS rollout_calls, rw.ingested_ns
FROM rw_step rw
LEFT JOIN (SELECT rollout_id, count(*) AS rollout_calls FROM calls GROUP BY rollout_id) n
       ON n.rollout_id = rw.rollout_id
UNION ALL BY NAME
SELECT 'rollout' AS row_kind, ro.rollout_id, ro.task_id, ro.attempt, ro.mode, ro.status, ro.ended_by,
       ro.start_ns, ro.end_ns,
       ro.span_rows AS span_count, coalesce(d.n, 0) AS duplicate_spans, coalesce(l.n, 0) AS late_arrivals,
       coalesce(o.n, 0) AS orphan_calls, coalesce(dc.n, 0) AS duplicate_calls
FROM ro
LEFT JOIN dups d USING (rollout_id)
LEFT JOIN dup_calls dc USING (rollout_id)
LEFT JOIN lates l USING (rollout_id)
LEFT JOIN orphans o USING (rollout_id)

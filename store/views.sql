-- Macros and views over the spans table (store/schema.sql). Created by SpanStore.open on every open, so
-- they always match this file. JSON keys with dots must be quoted: '$."gen_ai.request.model"'.
--
-- Three rules are defined here once, and everything else (these views, store/rollouts.py, store/online.py,
-- the decomposer, the viewer) goes through them:
--   * attribution (`trace_rollouts`, `rollout_spans`): which rollout a span belongs to;
--   * verdicts (`rollout_rewards`): which rollout a reward belongs to, wherever it was sent from;
--   * status (`rollout_state`): when a rollout has finished.
-- Each macro takes `since_ns`: only spans ingested at or after it are read (0: all), so a poll over
-- the spans of one training run stays cheap as the store grows.

-- Attribution, step 1: the rollout of each trace. A trace whose spans carry exactly one rollout id
-- belongs to that rollout. A trace without ids belongs to the rollout the policy server attributed a
-- call of it to (by URL path or headers): its client span has the server span's gen_ai.response.id.
-- A trace whose spans name two rollouts is ambiguous: its spans without ids stay unattributed.
-- A trace no rollout id reached at all (a production agent that knows nothing of spanrl) belongs to a
-- rollout when the policy server served a call of it (a SERVER span with a response id), by the first of:
--   * its conversation: the one gen_ai.conversation.id its spans name -> 'conversation:<id>' (every trace
--     of a conversation is one rollout; two conversations in one trace: unattributed);
--   * its trace, when the client sent a traceparent (the server span has a parent) -> 'trace:<trace_id>';
--   * the single response, when it did not -> 'response:<gen_ai.response.id>'.
-- `unattributed_only`: only traces with a span without an id (what rollout_spans needs; most spans carry
-- their id, and grouping every trace of the store cost ~0.03 s per 1M spans on each use).
CREATE OR REPLACE MACRO trace_rollouts(since_ns, unattributed_only := FALSE) AS TABLE
WITH own AS (
    SELECT trace_id, min(rollout_id) AS rollout_id, min(rollout_id) = max(rollout_id) AS single
    FROM spans
    WHERE rollout_id IS NOT NULL AND ingested_ns >= since_ns
      AND (NOT unattributed_only
           OR trace_id IN (SELECT trace_id FROM spans WHERE rollout_id IS NULL AND ingested_ns >= since_ns))
    GROUP BY trace_id
), linked AS (
    SELECT c.trace_id, min(s.rollout_id) AS rollout_id, min(s.rollout_id) = max(s.rollout_id) AS single
    FROM spans c
    JOIN spans s ON s.response_id = c.response_id
    WHERE c.rollout_id IS NULL AND c.response_id IS NOT NULL AND c.kind <> 'SERVER' AND c.ingested_ns >= since_ns
      AND s.rollout_id IS NOT NULL AND s.kind = 'SERVER' AND s.ingested_ns >= since_ns
      AND c.trace_id NOT IN (SELECT trace_id FROM own)
    GROUP BY c.trace_id
), served AS (  -- the policy server's calls in traces without any rollout id
    SELECT trace_id, bool_or(parent_span_id IS NOT NULL) AS traced, min(response_id) AS response_id
    FROM spans
    WHERE kind = 'SERVER' AND response_id IS NOT NULL AND rollout_id IS NULL AND ingested_ns >= since_ns
      AND trace_id NOT IN (SELECT trace_id FROM own) AND trace_id NOT IN (SELECT trace_id FROM linked)
    GROUP BY trace_id
), conversation AS (
    SELECT trace_id, min(c) AS c, min(c) = max(c) AS single
    FROM (SELECT trace_id, attributes ->> '$."gen_ai.conversation.id"' AS c FROM spans
          WHERE trace_id IN (SELECT trace_id FROM served) AND ingested_ns >= since_ns)
    WHERE c IS NOT NULL
    GROUP BY trace_id
)
SELECT trace_id, rollout_id FROM own WHERE single
UNION ALL
SELECT trace_id, rollout_id FROM linked WHERE single
UNION ALL
SELECT trace_id, CASE WHEN c.trace_id IS NOT NULL THEN 'conversation:' || c.c
                      WHEN s.traced THEN 'trace:' || s.trace_id
                      ELSE 'response:' || s.response_id END AS rollout_id
FROM served s LEFT JOIN conversation c USING (trace_id)
WHERE coalesce(c.single, TRUE);

-- The task of a rollout whose spans name none (spanrl.task.id), from the first call the policy server
-- served it (its gen_ai.input.messages, when the server records content), so that rollouts asking the
-- same thing share a baseline. task_from() picks the derivation (SPANRL_TASK_FROM, set when the store
-- is opened): 'first_user_message' (default): 'user:' + 16 hex of md5 of the first user message's parts;
-- 'input_messages': 'input:' + of all input messages; 'none': no task.
CREATE OR REPLACE MACRO task_from() AS '__TASK_FROM__';
CREATE OR REPLACE MACRO derived_task(messages) AS
CASE task_from()
    WHEN 'first_user_message' THEN 'user:' || left(md5(
        list_filter(from_json(messages, '[{"role": "VARCHAR", "parts": "JSON"}]'), lambda m: m.role = 'user')[1].parts
        ::VARCHAR), 16)
    WHEN 'input_messages' THEN 'input:' || left(md5(messages), 16)
END;

-- Attribution, step 2: every span with its rollout: its own spanrl.rollout.id (span attribute, else
-- resource attribute), else its trace's. `rid` is the span's rowid in `spans`.
CREATE OR REPLACE MACRO rollout_spans(since_ns) AS TABLE
SELECT s.rowid AS rid, s.* REPLACE (coalesce(s.rollout_id, t.rollout_id) AS rollout_id)
FROM spans s
LEFT JOIN trace_rollouts(since_ns, unattributed_only := TRUE) t  -- only traces with a span to attribute
    ON s.rollout_id IS NULL AND t.trace_id = s.trace_id
WHERE s.ingested_ns >= since_ns;

-- A usable reward: finite, |r| <= reward_abs_max() (semconv.REWARD_ABS_MAX). The collector rejects
-- the rest at ingest (collector/admission.py); these drop what was stored before it did, so no reader
-- (these views, the decomposer, load_transitions, the online trainer) sees one.
CREATE OR REPLACE MACRO reward_abs_max() AS 1e6::DOUBLE;
CREATE OR REPLACE MACRO reward_usable(x) AS coalesce(isfinite(x) AND abs(x) <= reward_abs_max(), FALSE);
CREATE OR REPLACE MACRO usable_reward(x) AS CASE WHEN reward_usable(x) THEN x ELSE 'NaN'::DOUBLE END;

-- Verdicts: one row per reward among spans ingested at or after since_ns: typed span rewards
-- (spanrl.reward.value / gen_ai.evaluation.score.value on a span) and reward events (spanrl.reward /
-- gen_ai.evaluation.result) unnested from the events JSON, each resolved to its rollout by the ONE rule
-- every reader uses (the rewards and rollouts views, `spanrl sql`, the viewer, the decomposer and so the
-- offline Trainer, the online trainer), by its key, first found:
--   * a response id: the event's gen_ai.response.id, else its span's (not a SERVER span's: that is the
--     call itself) -> the one rollout of the policy server's (SERVER) calls with that id; none when two
--     rollouts claim it; a response the server never served leaves the verdict its span's rollout;
--   * spanrl.feedback.trace_id on a spanrl.feedback span -> the rollout of that trace (trace_rollouts);
--   * the span's own rollout (rollout_spans: its spanrl.rollout.id, else its trace's);
--   A verdict from outside every rollout that names only a conversation (gen_ai.conversation.id) resolves to
--   none: conversation ids are chosen by clients and guessable, so any holder of an ingest token could score
--   another tenant's conversation (issue 53). Inside the conversation's own traces a verdict is that
--   rollout's (the span's own rollout); from outside, name the judged completion's gen_ai.response.id.
-- Keys resolve over spans ingested at or after keys_since_ns (NULL: since_ns): the viewer finds the
-- rollouts of new verdicts among older spans. `is_feedback`: a verdict from outside its rollout (a
-- spanrl.feedback span, or a span that belongs to no rollout). `rid` and `ingested_ns` are the span's;
-- task_id, attempt and mode too (NULL on a verdict from elsewhere). Several rewards of one rollout combine
-- by "latest by ingested_ns wins" (the rollouts view, store/online.py).
-- Only usable values (above) unless `usable_only := FALSE`; `usable` says which.
CREATE OR REPLACE MACRO rollout_rewards(since_ns, usable_only := TRUE, keys_since_ns := NULL) AS TABLE
WITH raw AS (
    SELECT rid, ingested_ns, rollout_id, task_id, attempt, mode, trace_id, span_id, kind, name AS span_name,
           end_ns AS time_ns,
           coalesce(reward_name, 'reward') AS name,
           reward_value AS value,
           'span' AS source,
           response_id,
           attributes ->> '$."gen_ai.conversation.id"' AS conversation_id,
           attributes ->> '$."spanrl.feedback.trace_id"' AS feedback_trace_id
    FROM rollout_spans(since_ns)
    WHERE reward_value IS NOT NULL
    UNION ALL
    SELECT rid, ingested_ns, rollout_id, task_id, attempt, mode, trace_id, span_id, kind, span_name,
           ev.time_ns AS time_ns,
           coalesce(ev.attributes ->> '$."spanrl.reward.name"',
                    ev.attributes ->> '$."gen_ai.evaluation.name"',
                    'reward') AS name,
           coalesce(TRY_CAST(ev.attributes ->> '$."spanrl.reward.value"' AS DOUBLE),
                    TRY_CAST(ev.attributes ->> '$."gen_ai.evaluation.score.value"' AS DOUBLE)) AS value,
           'event' AS source,
           coalesce(ev.attributes ->> '$."gen_ai.response.id"', response_id) AS response_id,
           coalesce(ev.attributes ->> '$."gen_ai.conversation.id"', conversation_id) AS conversation_id,
           feedback_trace_id
    FROM (
        SELECT rid, ingested_ns, rollout_id, task_id, attempt, mode, trace_id, span_id, kind, name AS span_name,
               response_id,
               attributes ->> '$."gen_ai.conversation.id"' AS conversation_id,
               attributes ->> '$."spanrl.feedback.trace_id"' AS feedback_trace_id,
               unnest(from_json(events, '[{"name": "VARCHAR", "time_ns": "BIGINT", "attributes": "JSON"}]')) AS ev
        FROM rollout_spans(since_ns)
        WHERE events IS NOT NULL
          AND (contains(events, 'spanrl.reward') OR contains(events, 'gen_ai.evaluation.result'))
    )
    WHERE ev.name IN ('spanrl.reward', 'gen_ai.evaluation.result')
      AND coalesce(TRY_CAST(ev.attributes ->> '$."spanrl.reward.value"' AS DOUBLE),
                   TRY_CAST(ev.attributes ->> '$."gen_ai.evaluation.score.value"' AS DOUBLE)) IS NOT NULL
), keyed AS (
    SELECT *,
           CASE WHEN kind <> 'SERVER' THEN response_id END AS key_response,
           CASE WHEN span_name = 'spanrl.feedback' THEN feedback_trace_id END AS key_trace
    FROM raw
    WHERE NOT usable_only OR reward_usable(value)
), keyspans AS MATERIALIZED (  -- the spans the keys name, attributed (one rollout_spans for the three keys)
    SELECT trace_id, kind, response_id, rollout_id
    FROM rollout_spans(coalesce(keys_since_ns, since_ns))
    WHERE rollout_id IS NOT NULL AND name <> 'spanrl.feedback'
      AND ((kind = 'SERVER' AND response_id IN (SELECT key_response FROM keyed))
           OR trace_id IN (SELECT key_trace FROM keyed))
), by_response AS (  -- only SERVER spans: a response id on one only the policy server's token stores
    SELECT response_id, min(rollout_id) AS rollout_id FROM keyspans
    WHERE kind = 'SERVER' AND response_id IN (SELECT key_response FROM keyed)
    GROUP BY response_id
    HAVING count(DISTINCT rollout_id) = 1
), by_trace AS (  -- the one rollout of that trace's spans
    SELECT trace_id, min(rollout_id) AS rollout_id FROM keyspans
    WHERE trace_id IN (SELECT key_trace FROM keyed)
    GROUP BY trace_id
    HAVING count(DISTINCT rollout_id) = 1
)
SELECT k.rid, k.ingested_ns,
       CASE WHEN k.key_response IS NOT NULL THEN coalesce(br.rollout_id, k.rollout_id)
            WHEN k.key_trace IS NOT NULL THEN bt.rollout_id
            ELSE k.rollout_id END AS rollout_id,
       k.task_id, k.attempt, k.mode, k.trace_id, k.span_id, k.time_ns, k.name, k.value, k.source,
       k.response_id, reward_usable(k.value) AS usable,
       k.span_name = 'spanrl.feedback' OR k.rollout_id IS NULL AS is_feedback
FROM keyed k
LEFT JOIN by_response br ON br.response_id = k.key_response
LEFT JOIN by_trace bt ON bt.trace_id = k.key_trace;

-- How long a rollout that never stored its end must be silent after a reward to count as finished: the
-- one quiet time of spanrl (rollout_state, the UI, the materializer, and the online trainer's default,
-- store/online.py). 60 s: an agent without a spanrl.rollout span may pause between calls for tool calls
-- or long generations, and a rollout closed early is trained on partially, once; waiting longer only
-- delays its update, well inside the online trainer's feedback window (max_age_s, 600 s).
CREATE OR REPLACE MACRO rollout_quiet_ns() AS 60_000_000_000::BIGINT;

-- Status: one row per rollout. A rollout's end is stored when
--   * its spanrl.rollout span is stored (the span ends when the rollout does): ended_by 'rollout_span';
--   * or a spanrl.rollout.end span is: written by the Trainer when the rollout's command-line agent
--     exited ('agent_exit'; its SDK flushed at exit, and the collector acknowledges only committed
--     spans), when a jsonl worker answered done ('agent_done'), when it timed out ('timeout'), or when
--     the Trainer says so ('trainer').
-- Without a stored end, a rollout with a reward among its own spans and no span ingested for
-- rollout_quiet_ns() is finished too ('quiet'). status: 'error' when the rollout span or
-- the end span has status ERROR, 'finished' when it ended otherwise, 'open' before.
CREATE OR REPLACE MACRO rollout_state(since_ns) AS TABLE
WITH s AS (
    SELECT rollout_id,
           coalesce(any_value(task_id),
                    derived_task(arg_min(CASE WHEN kind = 'SERVER' AND response_id IS NOT NULL AND task_id IS NULL
                                              THEN attributes ->> '$."gen_ai.input.messages"' END, start_ns)
                                 FILTER (WHERE kind = 'SERVER' AND response_id IS NOT NULL AND task_id IS NULL)))
               AS task_id,  -- derived only from calls without a task: free where spans name theirs
           max(attempt) AS attempt,
           any_value(mode) AS mode,
           min(start_ns) FILTER (WHERE name <> 'spanrl.rollout.end') AS start_ns,
           max(end_ns) FILTER (WHERE name <> 'spanrl.rollout.end') AS end_ns,
           count(*) AS span_count,
           count(*) FILTER (WHERE status_code = 'ERROR') AS error_count,
           bool_or(name = 'spanrl.rollout') AS has_rollout_span,
           arg_min(CASE WHEN name = 'spanrl.rollout.end' THEN attributes ->> '$."spanrl.rollout.end.reason"' END,
                   ingested_ns) FILTER (WHERE name = 'spanrl.rollout.end') AS end_reason,  -- JSON of end spans only
           bool_or(name IN ('spanrl.rollout', 'spanrl.rollout.end') AND status_code = 'ERROR') AS failed,
           min(ingested_ns) FILTER (WHERE name IN ('spanrl.rollout', 'spanrl.rollout.end')) AS end_ingested_ns,
           bool_or(reward_value IS NOT NULL OR name = 'spanrl.reward'
                   OR (events IS NOT NULL AND (contains(events, 'spanrl.reward')
                                               OR contains(events, 'gen_ai.evaluation.result')))) AS rewarded,
           bool_or(completion_token_ids IS NOT NULL) AS has_token_ids,
           max(ingested_ns) AS last_ingested_ns
    FROM rollout_spans(since_ns)
    WHERE rollout_id IS NOT NULL
    GROUP BY rollout_id
), e AS (
    SELECT *,
           CASE WHEN has_rollout_span THEN 'rollout_span'
                WHEN end_reason IS NOT NULL THEN end_reason
                WHEN rewarded AND last_ingested_ns < epoch_ns(now()) - rollout_quiet_ns() THEN 'quiet'
           END AS ended_by
    FROM s
)
SELECT *, CASE WHEN failed THEN 'error' WHEN ended_by IS NOT NULL THEN 'finished' ELSE 'open' END AS status
FROM e;

-- Every usable reward of the store (rollout_rewards over all spans: rollout_id is the resolved one).
-- ingested_ns: when the collector stored it, the order "latest wins" goes by (the sender's time_ns can
-- be anything).
CREATE OR REPLACE VIEW rewards AS
SELECT rollout_id, task_id, attempt, mode, trace_id, span_id, time_ns, name, value, source, ingested_ns
FROM rollout_rewards(0);

-- The attributes of a span's first event named `name` (JSON; NULL when it has none).
CREATE OR REPLACE MACRO event_attributes(events, name) AS
CASE WHEN contains(events, name) THEN list_filter(from_json(events, '[{"name": "VARCHAR", "attributes": "JSON"}]'),
                                                  lambda e: e.name = name)[1].attributes END;

-- GenAI events sent as OTLP log records (collector/logs.py): each is stored as a span of its own, named after the
-- event, child of the span the record was emitted in, marked spanrl.event.log_record. Per such span: the span it
-- concerns (trace_id, span_id: its parent), the event's attributes and time. Readers that look for an event on
-- the span it concerns (a call's details or upload results, a decision) read these too.
CREATE OR REPLACE MACRO logged_events(ev) AS TABLE
SELECT trace_id, parent_span_id AS span_id, event_attributes(events, ev) AS attributes, start_ns AS time_ns
FROM spans
WHERE name = ev AND parent_span_id IS NOT NULL AND attributes ->> '$."spanrl.event.log_record"' = 'true';

-- One row per LLM call span: client spans of instrumentors (gen_ai.operation.name chat, generate_content or
-- text_completion: semconv.LLM_OPERATIONS)
-- and the policy server's spans carrying exact token ids. The decomposer pairs and de-duplicates them.
-- Messages: the span's attributes, else its gen_ai.client.inference.operation.details event's (a span event, or a
-- log record emitted in the span: logged_events); content kept elsewhere is named by the *_ref columns (the decomposer reads it, store/messages.py).
CREATE OR REPLACE VIEW llm_calls AS
SELECT rollout_id, task_id, attempt, mode, trace_id, span_id, parent_span_id, name, kind,
       service_name, start_ns, end_ns, status_code, agent_name, operation_name, response_id,
       policy_version,
       attributes ->> '$."gen_ai.request.model"' AS request_model,
       attributes ->> '$."gen_ai.response.model"' AS response_model,
       TRY_CAST(attributes ->> '$."gen_ai.usage.input_tokens"' AS BIGINT) AS input_tokens,
       TRY_CAST(attributes ->> '$."gen_ai.usage.output_tokens"' AS BIGINT) AS output_tokens,
       coalesce(attributes ->> '$."gen_ai.input.messages"', d ->> '$."gen_ai.input.messages"') AS input_messages,
       coalesce(attributes ->> '$."gen_ai.output.messages"', d ->> '$."gen_ai.output.messages"') AS output_messages,
       prompt_token_ids, completion_token_ids, logprobs,
       prompt_token_ids IS NOT NULL AS has_token_ids,
       coalesce(attributes ->> '$."gen_ai.input.messages_ref"', d ->> '$."gen_ai.input.messages_ref"')
           AS input_messages_ref,
       coalesce(attributes ->> '$."gen_ai.output.messages_ref"', d ->> '$."gen_ai.output.messages_ref"')
           AS output_messages_ref
FROM (SELECT s.*, coalesce(event_attributes(s.events, 'gen_ai.client.inference.operation.details'), l.a) AS d
      FROM rollout_spans(0) s
      LEFT JOIN (SELECT trace_id, span_id, any_value(attributes) AS a
                 FROM logged_events('gen_ai.client.inference.operation.details') GROUP BY ALL) l
          ON l.trace_id = s.trace_id AND l.span_id = s.span_id)
WHERE operation_name IN ('chat', 'generate_content', 'text_completion') OR prompt_token_ids IS NOT NULL;

-- One row per tool call decision: semantic-conventions-genai's gen_ai.tool.call.decision event (outcome
-- gen_ai.tool.call.decision.outcome: allow | deny | require_approval; gen_ai.tool.call.id and gen_ai.tool.name
-- when known) on any span of the rollout: a denied call may have no execute_tool span, and the spec's
-- instrumentations record it where the agent decides (its invoke_agent or chat span). Also the attribute
-- gen_ai.tool.call.decision on an execute_tool span, the form spanrl read before the event (kept readable:
-- deployments upgrade one at a time); its time is the span's start. on_tool_span: carried by an execute_tool
-- span; tool_call_id / tool_name: the event's, else that tool span's.
CREATE OR REPLACE VIEW tool_decisions AS
WITH s AS MATERIALIZED (  -- one scan: the spans with a decision event or the decision attribute
    SELECT rollout_id, trace_id, span_id, parent_span_id, operation_name, attributes, events, start_ns
    FROM rollout_spans(0)
    WHERE (events IS NOT NULL AND contains(events, 'gen_ai.tool.call.decision'))
       OR (operation_name = 'execute_tool' AND attributes ->> '$."gen_ai.tool.call.decision"' IS NOT NULL)
)
SELECT rollout_id, trace_id, span_id, on_tool_span, ev.time_ns AS time_ns,
       ev.attributes ->> '$."gen_ai.tool.call.decision.outcome"' AS outcome,
       coalesce(ev.attributes ->> '$."gen_ai.tool.call.id"', span_call_id) AS tool_call_id,
       coalesce(ev.attributes ->> '$."gen_ai.tool.name"', span_tool_name) AS tool_name,
       'event' AS source
FROM (  -- an event sent as a log record is on its parent, the span it was emitted in (logged_events)
    SELECT s.rollout_id, s.trace_id,
           CASE WHEN s.attributes ->> '$."spanrl.event.log_record"' = 'true'
                THEN coalesce(s.parent_span_id, s.span_id) ELSE s.span_id END AS span_id,
           coalesce(coalesce(p.operation_name, s.operation_name) = 'execute_tool', FALSE) AS on_tool_span,
           CASE WHEN on_tool_span THEN coalesce(p.attributes, s.attributes) ->> '$."gen_ai.tool.call.id"' END
               AS span_call_id,
           CASE WHEN on_tool_span THEN coalesce(p.attributes, s.attributes) ->> '$."gen_ai.tool.name"' END
               AS span_tool_name,
           unnest(from_json(s.events, '[{"name": "VARCHAR", "time_ns": "BIGINT", "attributes": "JSON"}]')) AS ev
    FROM s
    LEFT JOIN spans p ON s.attributes ->> '$."spanrl.event.log_record"' = 'true'
                     AND p.trace_id = s.trace_id AND p.span_id = s.parent_span_id
    WHERE s.events IS NOT NULL AND contains(s.events, 'gen_ai.tool.call.decision')
)
WHERE ev.name = 'gen_ai.tool.call.decision' AND ev.attributes ->> '$."gen_ai.tool.call.decision.outcome"' IS NOT NULL
UNION ALL
SELECT rollout_id, trace_id, span_id, TRUE, start_ns, attributes ->> '$."gen_ai.tool.call.decision"',
       attributes ->> '$."gen_ai.tool.call.id"', attributes ->> '$."gen_ai.tool.name"', 'attribute'
FROM s
WHERE operation_name = 'execute_tool' AND attributes ->> '$."gen_ai.tool.call.decision"' IS NOT NULL;

-- One row per tool call span (gen_ai.operation.name execute_tool): what the step did and how it went.
-- decision: the latest (by time) of the tool_decisions above that are the span's own or name its
-- gen_ai.tool.call.id in its rollout (require_approval, then allow or deny: the last one holds);
-- exit_code: a command tool's process.exit.code; error_type: error.type.
CREATE OR REPLACE VIEW tool_calls AS
WITH t AS (
    SELECT rid, rollout_id, task_id, attempt, mode, trace_id, span_id, parent_span_id, name, service_name,
           start_ns, end_ns, status_code, status_message,
           attributes ->> '$."gen_ai.tool.name"' AS tool_name,
           attributes ->> '$."gen_ai.tool.call.id"' AS tool_call_id,
           TRY_CAST(attributes ->> '$."process.exit.code"' AS BIGINT) AS exit_code,
           attributes ->> '$."error.type"' AS error_type,
           attributes ->> '$."gen_ai.tool.call.arguments"' AS arguments,
           attributes ->> '$."gen_ai.tool.call.result"' AS result
    FROM rollout_spans(0)
    WHERE operation_name = 'execute_tool'
), d AS MATERIALIZED (
    SELECT * FROM tool_decisions
), decided AS (  -- two equi-joins (an OR join would compare every pair)
    SELECT rid, arg_max(outcome, time_ns) AS decision
    FROM (SELECT t.rid, d.outcome, d.time_ns FROM t JOIN d ON d.trace_id = t.trace_id AND d.span_id = t.span_id
          UNION ALL
          SELECT t.rid, d.outcome, d.time_ns FROM t JOIN d ON d.rollout_id = t.rollout_id
                                                          AND d.tool_call_id = t.tool_call_id)
    GROUP BY rid
)
SELECT rollout_id, task_id, attempt, mode, trace_id, span_id, parent_span_id, name, service_name, start_ns, end_ns,
       status_code, status_message, tool_name, tool_call_id, decided.decision, exit_code, error_type, arguments, result
FROM t LEFT JOIN decided USING (rid);

-- One row per rollout: its status (rollout_state above) and rewards. final_reward: the last reward stored
-- (any name; by ingested_ns, then the sender's time_ns within one commit).
CREATE OR REPLACE VIEW rollouts AS
WITH r AS (
    SELECT rollout_id, arg_max(value, [ingested_ns, time_ns]) AS final_reward, count(*) AS reward_count
    FROM rewards
    WHERE rollout_id IS NOT NULL
    GROUP BY rollout_id
)
SELECT s.rollout_id, s.task_id, s.attempt, s.mode, s.start_ns, s.end_ns, s.status, s.ended_by,
       r.final_reward, coalesce(r.reward_count, 0) AS reward_count, s.span_count, s.error_count
FROM rollout_state(0) s LEFT JOIN r USING (rollout_id);

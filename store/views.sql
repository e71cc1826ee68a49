-- Views over the spans table (store/schema.sql). Created by SpanStore.open on every open, so they
-- always match this file. JSON keys with dots must be quoted: '$."gen_ai.request.model"'.

-- One row per reward: typed span rewards (spanrl.reward.value / gen_ai.evaluation.score.value on a span)
-- and reward events (spanrl.reward / gen_ai.evaluation.result) unnested from the events JSON.
CREATE OR REPLACE VIEW rewards AS
SELECT rollout_id, task_id, attempt, mode, trace_id, span_id,
       end_ns AS time_ns,
       coalesce(reward_name, 'reward') AS name,
       reward_value AS value,
       'span' AS source
FROM spans
WHERE reward_value IS NOT NULL
UNION ALL
SELECT rollout_id, task_id, attempt, mode, trace_id, span_id,
       ev.time_ns AS time_ns,
       coalesce(ev.attributes ->> '$."spanrl.reward.name"',
                ev.attributes ->> '$."gen_ai.evaluation.name"',
                'reward') AS name,
       coalesce(TRY_CAST(ev.attributes ->> '$."spanrl.reward.value"' AS DOUBLE),
                TRY_CAST(ev.attributes ->> '$."gen_ai.evaluation.score.value"' AS DOUBLE)) AS value,
       'event' AS source
FROM (
    SELECT rollout_id, task_id, attempt, mode, trace_id, span_id,
           unnest(from_json(events, '[{"name": "VARCHAR", "time_ns": "BIGINT", "attributes": "JSON"}]')) AS ev
    FROM spans
    WHERE events IS NOT NULL
      AND (contains(events, 'spanrl.reward') OR contains(events, 'gen_ai.evaluation.result'))
)
WHERE ev.name IN ('spanrl.reward', 'gen_ai.evaluation.result')
  AND coalesce(TRY_CAST(ev.attributes ->> '$."spanrl.reward.value"' AS DOUBLE),
               TRY_CAST(ev.attributes ->> '$."gen_ai.evaluation.score.value"' AS DOUBLE)) IS NOT NULL;

-- One row per LLM call span: client spans of instrumentors (gen_ai.operation.name chat/text_completion)
-- and the policy server's spans carrying exact token ids. The decomposer pairs and de-duplicates them.
CREATE OR REPLACE VIEW llm_calls AS
SELECT rollout_id, task_id, attempt, mode, trace_id, span_id, parent_span_id, name, kind,
       service_name, start_ns, end_ns, status_code, agent_name, operation_name, response_id,
       policy_version,
       attributes ->> '$."gen_ai.request.model"' AS request_model,
       attributes ->> '$."gen_ai.response.model"' AS response_model,
       TRY_CAST(attributes ->> '$."gen_ai.usage.input_tokens"' AS BIGINT) AS input_tokens,
       TRY_CAST(attributes ->> '$."gen_ai.usage.output_tokens"' AS BIGINT) AS output_tokens,
       attributes ->> '$."gen_ai.input.messages"' AS input_messages,
       attributes ->> '$."gen_ai.output.messages"' AS output_messages,
       prompt_token_ids, completion_token_ids, logprobs,
       prompt_token_ids IS NOT NULL AS has_token_ids
FROM spans
WHERE operation_name IN ('chat', 'text_completion') OR prompt_token_ids IS NOT NULL;

-- One row per rollout. status: 'error' when the spanrl.rollout span ended in ERROR, 'finished' when it
-- ended otherwise, 'open' while no spanrl.rollout span is stored (still running, or an agent that never
-- opens one). final_reward: the last reward by time (any name).
CREATE OR REPLACE VIEW rollouts AS
WITH s AS (
    SELECT rollout_id,
           any_value(task_id) AS task_id,
           max(attempt) AS attempt,
           any_value(mode) AS mode,
           min(start_ns) AS start_ns,
           max(end_ns) AS end_ns,
           count(*) AS span_count,
           count(*) FILTER (WHERE status_code = 'ERROR') AS error_count,
           bool_or(name = 'spanrl.rollout') AS has_rollout_span,
           bool_or(name = 'spanrl.rollout' AND status_code = 'ERROR') AS rollout_failed
    FROM spans
    WHERE rollout_id IS NOT NULL
    GROUP BY rollout_id
), r AS (
    SELECT rollout_id, arg_max(value, time_ns) AS final_reward, count(*) AS reward_count
    FROM rewards
    WHERE rollout_id IS NOT NULL
    GROUP BY rollout_id
)
SELECT s.rollout_id, s.task_id, s.attempt, s.mode, s.start_ns, s.end_ns,
       CASE WHEN s.rollout_failed THEN 'error' WHEN s.has_rollout_span THEN 'finished' ELSE 'open' END AS status,
       r.final_reward, coalesce(r.reward_count, 0) AS reward_count, s.span_count, s.error_count
FROM s LEFT JOIN r USING (rollout_id);

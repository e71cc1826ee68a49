-- The span store: one row per span, as the collector commits it.
-- Typed columns hold what the pipeline keys on; everything else is kept whole as JSON.
-- Contract between collector/ (writer), store/ (views, decomposer) and users' SQL: columns may be added,
-- never renamed. Ids are lowercase hex. Times are unix-epoch nanoseconds.
CREATE TABLE IF NOT EXISTS spans (
    trace_id             VARCHAR NOT NULL,  -- 32 hex chars
    span_id              VARCHAR NOT NULL,  -- 16 hex chars
    parent_span_id       VARCHAR,           -- NULL for a root span
    name                 VARCHAR NOT NULL,
    kind                 VARCHAR NOT NULL,  -- INTERNAL | SERVER | CLIENT | PRODUCER | CONSUMER | UNSPECIFIED
    start_ns             BIGINT NOT NULL,
    end_ns               BIGINT NOT NULL,
    status_code          VARCHAR NOT NULL,  -- UNSET | OK | ERROR
    status_message       VARCHAR,
    service_name         VARCHAR,           -- resource service.name
    scope_name           VARCHAR,
    scope_version        VARCHAR,
    rollout_id           VARCHAR,           -- spanrl.rollout.id: span attribute, else resource attribute
    task_id              VARCHAR,           -- spanrl.task.id: likewise
    attempt              INTEGER,           -- spanrl.rollout.attempt: likewise
    mode                 VARCHAR,           -- spanrl.rollout.mode: likewise
    agent_name           VARCHAR,           -- gen_ai.agent.name on this span
    operation_name       VARCHAR,           -- gen_ai.operation.name
    response_id          VARCHAR,           -- gen_ai.response.id
    policy_version       INTEGER,           -- spanrl.policy.version
    prompt_token_ids     INTEGER[],         -- spanrl.llm.prompt_token_ids (array or base64 int32le)
    completion_token_ids INTEGER[],         -- spanrl.llm.completion_token_ids
    logprobs             FLOAT[],           -- spanrl.llm.logprobs (array or base64 float32le)
    reward_value         DOUBLE,            -- spanrl.reward.value or gen_ai.evaluation.score.value
    reward_name          VARCHAR,           -- spanrl.reward.name or gen_ai.evaluation.name
    attributes           JSON,              -- all span attributes except the three token arrays
    resource             JSON,              -- resource attributes
    events               JSON,              -- [{"name", "time_ns", "attributes"}]
    links                JSON,              -- [{"trace_id", "span_id", "attributes"}]
    ingested_ns          BIGINT NOT NULL    -- when the collector committed the span
);

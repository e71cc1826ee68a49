"""The span vocabulary: every attribute, span and event name spanrl reads or writes, defined once.

This is the wire contract any language can follow; ``docs/conventions.md`` documents it. Downstream
code keys on ``gen_ai.operation.name`` and these attributes, never on span names.
"""

from __future__ import annotations

# --- Rollout context (resource attributes from SPANRL_* env vars, or span attributes / baggage) ----
ROLLOUT_ID = "spanrl.rollout.id"
TASK_ID = "spanrl.task.id"
ATTEMPT = "spanrl.rollout.attempt"
MODE = "spanrl.rollout.mode"  # "train" | "val"
ROLLOUT_SPAN_NAME = "spanrl.rollout"
TENANT = "spanrl.tenant"  # on the policy server's spans: the tenant its API key names (serving/tenants.py)

# --- Rollout URLs: a request's path names its rollout (policy server, any OpenAI-compatible proxy) --
ROLLOUT_PATH_PREFIXES = (
    "",
    "/rollouts/{rollout_id}",
    "/rollouts/{rollout_id}/attempts/{attempt}",
    "/tasks/{task_id}/rollouts/{rollout_id}",
    "/tasks/{task_id}/rollouts/{rollout_id}/attempts/{attempt}",
    "/rollouts/{rollout_id}/seeds/{seed}",
)
"""Path prefixes before ``/v1/...`` that attribute a request to a rollout (and an attempt, a task); with
``seeds/{seed}`` the policy server seeds the rollout's calls that name no ``seed`` (``spanrl.seeding``)."""
ROLLOUT_SEED = "spanrl.rollout.seed"  # int: the seed in a request's path, on the server's spans


def rollout_base_url(root: str, rollout_id: str, attempt: int | None = None, *, seed: int | None = None) -> str:
    """The ``OPENAI_BASE_URL`` under server ``root`` (``http://HOST:PORT``) attributing requests to a rollout
    (and, with ``seed``, seeding its calls: not combined with ``attempt``)."""
    if seed is not None and attempt is not None:
        raise ValueError("a rollout URL names its attempt or its seed, not both")
    suffix = f"/attempts/{attempt}" if attempt is not None else f"/seeds/{seed}" if seed is not None else ""
    return f"{root.rstrip('/')}/rollouts/{rollout_id}{suffix}/v1"


# --- Exact tokens, written by the policy server on its SERVER span --------------------------------
# Each may be a plain array (int / double) or, compactly, a string holding base64 of little-endian
# int32 (token ids) or float32 (logprobs). The store accepts both and fills typed columns.
LLM_PROMPT_TOKEN_IDS = "spanrl.llm.prompt_token_ids"
LLM_COMPLETION_TOKEN_IDS = "spanrl.llm.completion_token_ids"
LLM_LOGPROBS = "spanrl.llm.logprobs"
# The temperature the logprobs were computed at (the sampling temperature; 1.0 for a greedy request,
# whose logprobs are a plain softmax): training divides its logits by the same one or skips the call.
LLM_LOGPROBS_TEMPERATURE = "spanrl.llm.logprobs_temperature"  # double
LLM_BATCH_SIZE = "spanrl.llm.batch_size"
LLM_CHOICE_INDEX = "spanrl.llm.choice_index"
POLICY_VERSION = "spanrl.policy.version"  # with an adapter: that adapter's own version
POLICY_ADAPTER = "spanrl.policy.adapter"  # the LoRA adapter that served the call (absent: the base model)

# --- Rewards ---------------------------------------------------------------------------------------
REWARD_SPAN_NAME = "spanrl.reward"  # also accepted as an event name
REWARD_VALUE = "spanrl.reward.value"  # double
REWARD_NAME = "spanrl.reward.name"  # optional, for multi-dimensional rewards; default "reward"
DEFAULT_REWARD_NAME = "reward"
REWARD_ABS_MAX = 1e6
"""The largest |reward| anything reads: the collector's default ``reward_range`` is [-1e6, 1e6] (a narrower
one may be configured, never a wider one), and store/views.sql's ``reward_abs_max()`` drops the rest."""

# --- Late feedback (spanrl.emit_feedback): a reward for a finished rollout, from any process ---------
# A span named spanrl.feedback with the reward attributes and exactly one key: spanrl.rollout.id,
# gen_ai.response.id (a completion of the rollout) or spanrl.feedback.trace_id (a trace of the rollout).
FEEDBACK_SPAN_NAME = "spanrl.feedback"
FEEDBACK_TRACE_ID = "spanrl.feedback.trace_id"  # 32 lowercase hex characters

# --- OpenTelemetry GenAI semantic conventions -----------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"  # the OP_* values below; others (embeddings, ...) are ignored
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_SYSTEM = "gen_ai.system"  # older name of the provider, still written by OpenLLMetry
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"  # a production rollout (store/views.sql, attribution)
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"  # int: the seed the server sampled with (choice i: seed + i)
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # JSON
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # JSON
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
GEN_AI_TOOL_DEFINITIONS = "gen_ai.tool.definitions"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"

# Content kept outside the span (an upload hook, e.g. opentelemetry-util-genai's fsspec one): a URI whose
# object holds the JSON the attribute of the same name without _ref would (store/messages.py reads it). The spec
# names them only on the upload's gen_ai.content.storage.result event (reference/reports @ f5e81ce), with the
# required gen_ai.content.storage.status (stored | dropped | failed) and error.type on a failure; the hook
# also sets them on the call's span.
GEN_AI_INPUT_MESSAGES_REF = "gen_ai.input.messages_ref"
GEN_AI_OUTPUT_MESSAGES_REF = "gen_ai.output.messages_ref"
GEN_AI_SYSTEM_INSTRUCTIONS_REF = "gen_ai.system_instructions_ref"
GEN_AI_CONTENT_STORAGE_RESULT_EVENT = "gen_ai.content.storage.result"
GEN_AI_CONTENT_STORAGE_STATUS = "gen_ai.content.storage.status"
# The inference call's messages as an event (recommended since semantic-conventions-genai #579), on the
# call's span; read when the span's own attributes lack them.
GEN_AI_INFERENCE_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
# Invocation spans (semantic-conventions-genai #571; registry.yaml and spans.yaml @ e9de14b, docs/conventions.md
# section 7): the span type gen_ai.invocation.internal replaces invoke_agent.internal / invoke_workflow.internal,
# and a framework runner's turn has the operation handle_conversation_turn. spanrl keys on gen_ai.operation.name,
# so old and new span types read alike; only invoke_agent names the agent of the calls below it.
GEN_AI_INVOCATION_IS_NESTED = "gen_ai.invocation.is_nested"  # boolean
# Tools: the decision taken on a call before it ran: the event gen_ai.tool.call.decision, its required attribute
# gen_ai.tool.call.decision.outcome (allow | deny | require_approval) with gen_ai.tool.call.id / gen_ai.tool.name,
# on any span (a denied call may have no tool span); GEN_AI_TOOL_CALL_DECISION as an attribute of the tool span is
# the form spanrl read before the spec had the event, still read (store/views.sql, tool_decisions).
GEN_AI_TOOL_CALL_DECISION = "gen_ai.tool.call.decision"
GEN_AI_TOOL_CALL_DECISION_OUTCOME = "gen_ai.tool.call.decision.outcome"
PROCESS_EXIT_CODE = "process.exit.code"  # int
ERROR_TYPE = "error.type"

# gen_ai.operation.name values (registry.yaml @ e9de14b). An inference call is chat, generate_content (Gemini's
# multimodal generation, as the Google GenAI instrumentations name it) or text_completion.
OP_CHAT = "chat"
OP_GENERATE_CONTENT = "generate_content"
OP_TEXT_COMPLETION = "text_completion"
OP_EXECUTE_TOOL = "execute_tool"
OP_INVOKE_AGENT = "invoke_agent"
OP_INVOKE_WORKFLOW = "invoke_workflow"
OP_HANDLE_CONVERSATION_TURN = "handle_conversation_turn"
LLM_OPERATIONS = (OP_CHAT, OP_GENERATE_CONTENT, OP_TEXT_COMPLETION)

# Evaluation results (GenAI semconv): an event on the evaluated span, or on a span of its own.
GEN_AI_EVALUATION_RESULT_EVENT = "gen_ai.evaluation.result"
GEN_AI_EVALUATION_NAME = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"

# --- Credit diagnostics (docs/credit.md): what the environment knows about a state or a call -------
# The environment state an LLM call observed (GiGPO's anchor state): on the call's span, or on the tool
# span whose result the next call observes. Any string; equal strings are the same state.
STATE_ID = "spanrl.state.id"
# Ground truth for a credit audit (`spanrl credit audit`): was this call a good decision? A boolean on the
# LLM call's span, or on any span of the rollout with the call's gen_ai.response.id. Diagnostics only:
# never read as a reward.
LABEL_GOOD = "spanrl.label.good"

# --- Observations ---------------------------------------------------------------------------------
OBSERVATION_EVENT = "spanrl.observation"
OBSERVATION_CONTENT = "spanrl.observation.content"
EMIT_ERROR = "spanrl.emit.error"  # set on a span when an emit_* call got a bad value

# --- GenAI events sent as OTLP log records (collector/logs.py) ---------------------------------------
# Each is stored as a span of its own, child of the span the record was emitted in, holding the event; this
# attribute (true) marks such spans, so readers look for the event under that parent.
LOG_RECORD_EVENT = "spanrl.event.log_record"

# --- Standard resource attributes -----------------------------------------------------------------
SERVICE_NAME = "service.name"

# --- Rollout end, stored by the Trainer when it knows a rollout is over (store/rollouts.py) --------
ROLLOUT_END_SPAN_NAME = "spanrl.rollout.end"
ROLLOUT_END_REASON = "spanrl.rollout.end.reason"  # agent_exit | agent_done | timeout | crashed | trainer

DERIVED_ROLLOUT_PREFIXES = ("conversation:", "trace:", "response:")
"""Rollout ids the store derives itself (store/views.sql: a conversation's traces, a trace or a response with no
rollout id); no span may name one (collector/sender.py), so imported trajectories that carry one get
``IMPORTED_ROLLOUT_PREFIX`` before it (store/atif.py)."""
IMPORTED_ROLLOUT_PREFIX = "imported:"

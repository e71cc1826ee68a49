// The spanrl span conventions for JavaScript agents (docs/conventions.md): attribute names, the rollout
// resource from SPANRL_* variables, and rewards as `spanrl.reward` spans. No dependency beyond the OTel API.
'use strict';

const { trace, SpanKind, SpanStatusCode } = require('@opentelemetry/api');

const ATTR = Object.freeze({
  ROLLOUT_ID: 'spanrl.rollout.id',
  TASK_ID: 'spanrl.task.id',
  ATTEMPT: 'spanrl.rollout.attempt',
  MODE: 'spanrl.rollout.mode',
  REWARD_VALUE: 'spanrl.reward.value',
  REWARD_NAME: 'spanrl.reward.name',
  EMIT_ERROR: 'spanrl.emit.error',
  OPERATION: 'gen_ai.operation.name',
  PROVIDER: 'gen_ai.provider.name',
  REQUEST_MODEL: 'gen_ai.request.model',
  RESPONSE_MODEL: 'gen_ai.response.model',
  RESPONSE_ID: 'gen_ai.response.id',
  FINISH_REASONS: 'gen_ai.response.finish_reasons',
  INPUT_MESSAGES: 'gen_ai.input.messages',
  OUTPUT_MESSAGES: 'gen_ai.output.messages',
  INPUT_TOKENS: 'gen_ai.usage.input_tokens',
  OUTPUT_TOKENS: 'gen_ai.usage.output_tokens',
  EVALUATION_NAME: 'gen_ai.evaluation.name',
  EVALUATION_SCORE: 'gen_ai.evaluation.score.value',
  AGENT_NAME: 'gen_ai.agent.name',
});
const REWARD_SPAN = 'spanrl.reward';

/** Resource attributes of this rollout, from the variables the spanrl trainer sets. */
function rolloutResourceAttributes(env = process.env) {
  const attrs = {};
  if (env.SPANRL_ROLLOUT_ID) attrs[ATTR.ROLLOUT_ID] = env.SPANRL_ROLLOUT_ID;
  if (env.SPANRL_TASK_ID) attrs[ATTR.TASK_ID] = env.SPANRL_TASK_ID;
  const attempt = Number.parseInt(env.SPANRL_ATTEMPT ?? '', 10);
  if (Number.isInteger(attempt)) attrs[ATTR.ATTEMPT] = attempt;
  if (env.SPANRL_MODE || env.SPANRL_ROLLOUT_ID) attrs[ATTR.MODE] = env.SPANRL_MODE || 'train';
  return attrs;
}

/** OpenAI chat messages ({role, content}) in the GenAI semconv shape ({role, parts}). */
function toGenAIMessages(messages, finishReason) {
  return messages.map((m) => {
    const out = { role: m.role, parts: [{ type: 'text', content: m.content ?? '' }] };
    if (finishReason) out.finish_reason = finishReason;
    return out;
  });
}

/** Record a reward: a `spanrl.reward` span (child of the active span). Never throws. */
function emitReward(value, name = 'reward') {
  const span = trace.getTracer('spanrl').startSpan(REWARD_SPAN, { kind: SpanKind.INTERNAL });
  try {
    if (typeof value !== 'number' || !Number.isFinite(value)) {
      const why = `reward ${JSON.stringify(name)} must be a finite number, got ${String(value)}`;
      console.warn(`spanrl: ${why}`);
      span.setAttribute(ATTR.EMIT_ERROR, why);
      span.setStatus({ code: SpanStatusCode.ERROR, message: why });
      return;
    }
    span.setAttributes({
      [ATTR.REWARD_VALUE]: value,
      [ATTR.REWARD_NAME]: name,
      [ATTR.EVALUATION_SCORE]: value,
      [ATTR.EVALUATION_NAME]: name,
    });
  } catch (err) {
    console.warn(`spanrl: emitReward failed: ${err}`);
  } finally {
    span.end();
  }
}

module.exports = { ATTR, REWARD_SPAN, emitReward, rolloutResourceAttributes, toGenAIMessages };

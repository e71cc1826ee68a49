// A Node.js agent trained by spanrl. It asks an OpenAI-compatible endpoint (OPENAI_BASE_URL) a question,
// records the call as a GenAI `chat` span, scores the answer and records the reward, all over OTLP/gRPC
// (OTEL_EXPORTER_OTLP_ENDPOINT, default http://127.0.0.1:4317) to the spanrl collector.
//
//   SPANRL_ROLLOUT_ID=r1 OPENAI_BASE_URL=http://127.0.0.1:8000/v1 node agent.js "What is 2 + 3?" 5
//
// Started by the spanrl Trainer as a command-line agent, it reads its task from SPANRL_TASK
// ({"question": ..., "answer": ...}) and the sampling settings from SPANRL_SAMPLING (JSON).
'use strict';

const { NodeSDK, resources } = require('@opentelemetry/sdk-node');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-grpc');
const { context, propagation, trace, SpanKind, SpanStatusCode } = require('@opentelemetry/api');
const { ATTR, emitReward, rolloutResourceAttributes, toGenAIMessages } = require('./spanrl');

const MODEL = process.env.SPANRL_MODEL || 'tiny-calc';
const BASE_URL = (process.env.OPENAI_BASE_URL || 'http://127.0.0.1:8000/v1').replace(/\/+$/, '');
const ENDPOINT = process.env.OTEL_EXPORTER_OTLP_ENDPOINT || 'http://127.0.0.1:4317';
// The trainer's sampling settings (temperature 1 while training, 0 for held-out evaluation).
const SAMPLING = JSON.parse(process.env.SPANRL_SAMPLING || '{"temperature": 0}');

const sdk = new NodeSDK({
  serviceName: process.env.OTEL_SERVICE_NAME || 'spanrl-node-agent',
  resource: resources.resourceFromAttributes(rolloutResourceAttributes()),
  traceExporter: new OTLPTraceExporter({ url: ENDPOINT }),
  instrumentations: [],
});

/** One chat completion, recorded as a CLIENT span with gen_ai.* attributes. */
async function chat(messages) {
  const tracer = trace.getTracer('spanrl-node-agent');
  return tracer.startActiveSpan(`chat ${MODEL}`, { kind: SpanKind.CLIENT }, async (span) => {
    span.setAttributes({
      [ATTR.OPERATION]: 'chat',
      [ATTR.PROVIDER]: 'openai',
      [ATTR.REQUEST_MODEL]: MODEL,
      [ATTR.INPUT_MESSAGES]: JSON.stringify(toGenAIMessages(messages)),
    });
    try {
      const headers = {
        'content-type': 'application/json',
        authorization: `Bearer ${process.env.OPENAI_API_KEY || 'none'}`,
      };
      propagation.inject(context.active(), headers); // traceparent: the server span nests under this one
      const res = await fetch(`${BASE_URL}/chat/completions`, {
        method: 'POST',
        headers,
        body: JSON.stringify({ model: MODEL, messages, ...SAMPLING }),
      });
      if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
      const body = await res.json();
      const choice = body.choices[0];
      span.setAttributes({
        [ATTR.RESPONSE_ID]: body.id,
        [ATTR.RESPONSE_MODEL]: body.model,
        [ATTR.FINISH_REASONS]: [choice.finish_reason],
        [ATTR.OUTPUT_MESSAGES]: JSON.stringify(toGenAIMessages([choice.message], choice.finish_reason)),
        [ATTR.INPUT_TOKENS]: body.usage?.prompt_tokens ?? 0,
        [ATTR.OUTPUT_TOKENS]: body.usage?.completion_tokens ?? 0,
      });
      return choice.message.content ?? '';
    } catch (err) {
      span.recordException(err);
      span.setStatus({ code: SpanStatusCode.ERROR, message: String(err) });
      throw err;
    } finally {
      span.end();
    }
  });
}

async function main() {
  sdk.start();
  const task = process.env.SPANRL_TASK ? JSON.parse(process.env.SPANRL_TASK) : {};
  const question = task.question ?? process.argv[2] ?? 'What is 2 + 3?';
  const expected = String(task.answer ?? process.argv[3] ?? '5');
  const tracer = trace.getTracer('spanrl-node-agent');
  let exitCode = 0;
  await tracer.startActiveSpan('invoke_agent calculator', async (span) => {
    span.setAttributes({ [ATTR.OPERATION]: 'invoke_agent', [ATTR.AGENT_NAME]: 'calculator' });
    try {
      const answer = await chat([
        { role: 'system', content: 'You are a calculator. Answer with the number only.' },
        { role: 'user', content: question },
      ]);
      console.log(`answer: ${answer}`);
      emitReward(answer.trim() === expected ? 1.0 : 0.0);
    } catch (err) {
      console.error(`agent failed: ${err}`);
      exitCode = 1;
    } finally {
      span.end();
    }
  });
  await sdk.shutdown(); // flushes the batch of spans before exit
  process.exitCode = exitCode;
}

main();

"""An agent on Anthropic's own client (POST /v1/messages on ANTHROPIC_BASE_URL, which the trainer sets),
traced by the client's own OpenTelemetry support (its CLIENT span, traceparent sent) under
opentelemetry-instrument. The client has no sampling
arguments, so the temperature goes in the body as its users send it. The reward is a gen_ai.evaluation.result
event. No spanrl."""

import json
import os

import anthropic
from opentelemetry import trace

task = json.loads(os.environ["SPANRL_TASK"])
sampling = json.loads(os.environ["SPANRL_SAMPLING"])
tracer = trace.get_tracer("anthropic-agent")
with tracer.start_as_current_span("invoke_agent adder", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                 "gen_ai.agent.name": "adder"}) as span:
    reply = anthropic.Anthropic(max_retries=0).messages.create(
        model=os.environ["SPANRL_MODEL"], max_tokens=sampling["max_tokens"],
        messages=[{"role": "user", "content": task["question"]}],
        extra_body={k: v for k, v in sampling.items() if k in ("temperature", "top_p")},
    )
    text = "".join(block.text for block in reply.content if block.type == "text")
    score = 1.0 if str(task["answer"]) in text else 0.0
    span.add_event("gen_ai.evaluation.result",
                   {"gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": score})

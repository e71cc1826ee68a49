"""An agent with the official opentelemetry-instrumentation-openai-v2 (loaded by opentelemetry-instrument;
it sends no traceparent). The reward is a gen_ai.evaluation.result event. No spanrl anywhere."""

import json
import os

from openai import OpenAI
from opentelemetry import trace

task = json.loads(os.environ["SPANRL_TASK"])
sampling = json.loads(os.environ["SPANRL_SAMPLING"])
tracer = trace.get_tracer("openai-v2-agent")
with tracer.start_as_current_span("invoke_agent adder", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                 "gen_ai.agent.name": "adder"}) as span:
    reply = OpenAI(max_retries=0).chat.completions.create(
        model=os.environ["SPANRL_MODEL"], messages=[{"role": "user", "content": task["question"]}], **sampling
    )
    score = 1.0 if str(task["answer"]) in (reply.choices[0].message.content or "") else 0.0
    span.add_event("gen_ai.evaluation.result",
                   {"gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": score})

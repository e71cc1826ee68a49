"""An agent with no instrumentor at all: raw httpx, its own GenAI client span (W3C traceparent injected
by hand) and reward event, the SDK set up by opentelemetry-instrument from the standard variables."""

import json
import os

import httpx
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

task = json.loads(os.environ["SPANRL_TASK"])
sampling = json.loads(os.environ["SPANRL_SAMPLING"])
model = os.environ["SPANRL_MODEL"]
tracer = trace.get_tracer("handmade-agent")
with tracer.start_as_current_span("invoke_agent adder", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                 "gen_ai.agent.name": "adder"}) as agent:
    with tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT,
                                      attributes={"gen_ai.operation.name": "chat",
                                                  "gen_ai.request.model": model}) as call:
        headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
        propagate.inject(headers)
        body = {"model": model, "messages": [{"role": "user", "content": task["question"]}], **sampling}
        reply = httpx.post(f"{os.environ['OPENAI_BASE_URL']}/chat/completions", json=body, headers=headers,
                           timeout=60).json()
        call.set_attribute("gen_ai.response.id", reply["id"])
    text = reply["choices"][0]["message"]["content"] or ""
    agent.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "reward",
                                                 "gen_ai.evaluation.score.value": 1.0 if str(task["answer"]) in text
                                                 else 0.0})

"""A LiteLLM agent. LiteLLM's requests are not seen by the OpenAI instrumentors, and its own
``callbacks=["otel"]`` writes ``gen_ai.operation.name=chat`` onto the agent's current span, so neither is
used: ``opentelemetry-instrumentation-httpx`` (loaded by opentelemetry-instrument) sends ``traceparent``,
the policy server's span nests under the agent's ``invoke_agent`` span, and that span is the call (exact
tokens, agent name by ancestry). The reward is a gen_ai.evaluation.result event. No spanrl."""

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no cost map download

import litellm  # noqa: E402
from opentelemetry import trace  # noqa: E402

task = json.loads(os.environ["SPANRL_TASK"])
sampling = json.loads(os.environ["SPANRL_SAMPLING"])
tracer = trace.get_tracer("litellm-agent")
with tracer.start_as_current_span("invoke_agent adder", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                 "gen_ai.agent.name": "adder"}) as span:
    reply = litellm.completion(
        model=f"openai/{os.environ['SPANRL_MODEL']}", api_base=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"], messages=[{"role": "user", "content": task["question"]}],
        num_retries=0, **sampling,
    )
    score = 1.0 if str(task["answer"]) in (reply.choices[0].message.content or "") else 0.0
    span.add_event("gen_ai.evaluation.result",
                   {"gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": score})

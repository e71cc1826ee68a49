"""An OpenAI Agents SDK agent with one function tool on the SDK's default model, OpenAIResponsesModel (a
model name alone: POST /v1/responses on OPENAI_BASE_URL), its calls traced by OpenLLMetry under
opentelemetry-instrument. The SDK's own tracing (to OpenAI's platform) is off. The reward is a
gen_ai.evaluation.result event. No spanrl."""

import asyncio
import json
import os

from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from opentelemetry import trace


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    set_tracing_disabled(True)
    task = json.loads(os.environ["SPANRL_TASK"])
    sampling = json.loads(os.environ["SPANRL_SAMPLING"])
    agent = Agent(name="adder", instructions="Add the two numbers.", model=os.environ["SPANRL_MODEL"], tools=[add],
                  model_settings=ModelSettings(temperature=sampling.get("temperature"),
                                               max_tokens=sampling.get("max_tokens")))
    tracer = trace.get_tracer("agents-sdk-responses-agent")
    with tracer.start_as_current_span("invoke_agent adder", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                     "gen_ai.agent.name": "adder"}) as span:
        try:
            text = str((await Runner.run(agent, task["question"], max_turns=3)).final_output)
        except Exception as exc:  # a tiny model's malformed tool call, or too many turns: scored 0
            text = f"failed: {type(exc).__name__}"
        score = 1.0 if str(task["answer"]) in text else 0.0
        span.add_event("gen_ai.evaluation.result",
                       {"gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": score})


asyncio.run(main())

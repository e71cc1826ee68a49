"""An async agent streaming its answer, traced by OpenLLMetry (opentelemetry-instrumentation-openai) under
opentelemetry-instrument. The reward is a span of its own with gen_ai.evaluation.score.value. No spanrl."""

import asyncio
import json
import os

from openai import AsyncOpenAI
from opentelemetry import trace


async def main() -> None:
    task = json.loads(os.environ["SPANRL_TASK"])
    sampling = json.loads(os.environ["SPANRL_SAMPLING"])
    tracer = trace.get_tracer("openllmetry-agent")
    with tracer.start_as_current_span("invoke_agent adder", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                     "gen_ai.agent.name": "adder"}):
        stream = await AsyncOpenAI(max_retries=0).chat.completions.create(
            model=os.environ["SPANRL_MODEL"], messages=[{"role": "user", "content": task["question"]}],
            stream=True, **sampling,
        )
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        score = 1.0 if str(task["answer"]) in text else 0.0
        with tracer.start_as_current_span("evaluate", attributes={"gen_ai.evaluation.name": "reward",
                                                                  "gen_ai.evaluation.score.value": score}):
            pass


asyncio.run(main())

"""A LangGraph ReAct agent with one tool (LangChain ChatOpenAI), its OpenAI calls traced by OpenLLMetry
under opentelemetry-instrument. The reward is a gen_ai.evaluation.result event. No spanrl."""

import json
import os
import warnings

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from opentelemetry import trace

warnings.filterwarnings("ignore")  # create_react_agent's deprecation notice
from langgraph.prebuilt import create_react_agent  # noqa: E402


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


task = json.loads(os.environ["SPANRL_TASK"])
sampling = json.loads(os.environ["SPANRL_SAMPLING"])
llm = ChatOpenAI(model=os.environ["SPANRL_MODEL"], temperature=sampling.get("temperature", 1.0),
                 max_tokens=sampling.get("max_tokens"), max_retries=0)
graph = create_react_agent(llm, [add])
tracer = trace.get_tracer("langgraph-agent")
with tracer.start_as_current_span("invoke_agent adder", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                 "gen_ai.agent.name": "adder"}) as span:
    try:
        result = graph.invoke({"messages": [("user", task["question"])]}, {"recursion_limit": 6})
        text = str(result["messages"][-1].content)
    except Exception as exc:  # a tiny model's malformed tool call, or too many turns: scored 0
        text = f"failed: {type(exc).__name__}"
    score = 1.0 if str(task["answer"]) in text else 0.0
    span.add_event("gen_ai.evaluation.result",
                   {"gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": score})

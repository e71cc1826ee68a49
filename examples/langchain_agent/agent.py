"""A LangChain agent (langchain-openai ``ChatOpenAI`` with a bound ``search`` tool) on the search-QA task,
traced by ``opentelemetry-instrument`` with no code change but the reward line.

ChatOpenAI talks through the ``openai`` client, so the standard OpenAI instrumentor records every call
and the trainer's ``OPENAI_BASE_URL`` routes it to the policy server; the tool-calling loop below is
ordinary LangChain. The only spanrl line is ``spanrl.emit_reward(reward)``.

    SPANRL_TASK='{"question": "On which river does Ashfenwick lie?", "answer": "Esk"}' \
        OPENAI_BASE_URL=http://127.0.0.1:8000/v1 opentelemetry-instrument python examples/langchain_agent/agent.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import spanrl
from examples._runtime import llm_settings, sampling_value, serve
from examples.search_qa.agent import SYSTEM_PROMPT, search_tool
from examples.search_qa.search import answer_reward

DEFAULT_MAX_STEPS = 4
DEFAULT_MAX_TOKENS = 64
DEFAULT_TEMPERATURE = 1.0


@tool
def search(query: str) -> str:
    """Search the local encyclopedia of towns."""
    return search_tool(query)


def _text_action(message: AIMessage) -> tuple[str, str]:
    text = message.content if isinstance(message.content, str) else str(message.content)
    head, _, rest = text.strip().partition(":")
    if head.strip().lower() in ("search", "answer") and rest.strip():
        return head.strip().lower(), rest.strip()
    return "answer", text.strip()


def run_agent(chat: ChatOpenAI, question: str, *, max_steps: int = DEFAULT_MAX_STEPS) -> str:
    """The LangChain tool loop: call the model, run ``search`` tool calls, stop at an answer."""
    model = chat.bind_tools([search])
    messages: list[Any] = [SystemMessage(SYSTEM_PROMPT), HumanMessage(question)]
    for _ in range(max_steps):
        reply: AIMessage = model.invoke(messages)
        messages.append(reply)
        if reply.tool_calls:
            for call in reply.tool_calls:
                if call["name"] == "search":
                    messages.append(ToolMessage(search.invoke(call["args"]), tool_call_id=call["id"]))
                else:  # "answer" or anything else: its first argument is the answer
                    return str(next(iter(call["args"].values()), ""))
            continue
        action, argument = _text_action(reply)
        if action == "answer":
            return argument
        messages.append(HumanMessage(f"Search results:\n{search.invoke({'query': argument})}"))
    return ""


def episode(task: dict[str, Any], client: Any, model: str, sampling: dict[str, Any]) -> float:
    """One rollout on a search-QA task; emits and returns the reward."""
    for name in ("question", "answer"):
        if not isinstance(task.get(name), str) or not task[name].strip():
            raise ValueError(f"task[{name!r}] must be a non-empty string, got {task.get(name)!r}")
    chat = ChatOpenAI(model=model, base_url=str(client.base_url), api_key=client.api_key, max_retries=1,
                      temperature=float(sampling_value(sampling, task, "temperature", DEFAULT_TEMPERATURE)),
                      max_tokens=int(sampling_value(sampling, task, "max_tokens", DEFAULT_MAX_TOKENS)))
    answer = run_agent(chat, task["question"], max_steps=int(task.get("max_steps", DEFAULT_MAX_STEPS)))
    reward = answer_reward(answer, task["answer"])
    spanrl.emit_reward(reward)  # the one line spanrl adds
    return reward


def agent(task: dict[str, Any], llm: Any = None) -> None:
    """The trainer's callable form (the reward goes out as a span)."""
    settings = llm_settings(llm)
    episode(task, settings.client(), settings.model, settings.sampling)


if __name__ == "__main__":
    sys.exit(serve(episode))

"""Search-QA agent: answers questions about fictional towns by searching a local corpus (BM25, no
network), then answering. Reward: exact match or token F1 against the gold answer (search.py).

The model acts through OpenAI tool calls (``search(query)``, ``answer(text)``) or, for models without
tool calling, plain text lines ``search: QUERY`` / ``answer: TEXT`` (any other reply is taken as the
answer). Up to ``max_steps`` model calls per episode (default 4).

    SPANRL_TASK='{"question": "On which river does Varholm lie?", "answer": "Esk"}' \
        OPENAI_BASE_URL=http://127.0.0.1:8000/v1 opentelemetry-instrument python examples/search_qa/agent.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opentelemetry import trace

import spanrl
from examples._runtime import llm_settings, sampling_value, serve
from examples.search_qa.search import DEFAULT_TOP_K, answer_reward, default_index
from spanrl import semconv

DEFAULT_MAX_STEPS = 4
DEFAULT_MAX_TOKENS = 64
DEFAULT_TEMPERATURE = 1.0

SYSTEM_PROMPT = (
    "Answer the question about a town using the search tool over a local encyclopedia. "
    "Call search(query) to look things up, then answer(text) with a short answer (a word or a number). "
    "Without tools, write 'search: QUERY' or 'answer: TEXT'."
)
TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "Search the encyclopedia.",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                     "required": ["query"]}}},
    {"type": "function", "function": {"name": "answer", "description": "Give the final answer.",
                                      "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                                                     "required": ["text"]}}},
]

_tracer = trace.get_tracer("examples.search_qa")


def parse_action(message: Any) -> tuple[str, str, str | None]:
    """(action, argument, tool_call_id) from an assistant message: a tool call first, else text."""
    for call in getattr(message, "tool_calls", None) or []:
        try:
            args = json.loads(call.function.arguments or "{}")
        except ValueError:
            args = {}
        value = next(iter(args.values()), "") if isinstance(args, dict) else str(args)
        return call.function.name, str(value), call.id
    text = (getattr(message, "content", None) or "").strip()
    head, _, rest = text.partition(":")
    if head.strip().lower() in ("search", "answer") and rest.strip():
        return head.strip().lower(), rest.strip(), None
    return "answer", text, None


def search_tool(query: str, k: int = DEFAULT_TOP_K) -> str:
    """Run the search, traced as ``execute_tool search``; returns the text shown to the model."""
    with _tracer.start_as_current_span(f"{semconv.OP_EXECUTE_TOOL} search") as span:
        span.set_attribute(semconv.GEN_AI_OPERATION_NAME, semconv.OP_EXECUTE_TOOL)
        span.set_attribute(semconv.GEN_AI_TOOL_NAME, "search")
        span.set_attribute(semconv.GEN_AI_TOOL_CALL_ARGUMENTS, json.dumps({"query": query}))
        hits = default_index().search(query, k)
        result = "\n".join(f"[{h.title}] {h.text}" for h in hits) or "no results"
        span.set_attribute(semconv.GEN_AI_TOOL_CALL_RESULT, result)
        return result


def answer_question(client: Any, model: str, question: str, *, max_steps: int = DEFAULT_MAX_STEPS,
                    temperature: float = DEFAULT_TEMPERATURE, max_tokens: int = DEFAULT_MAX_TOKENS,
                    use_tools: bool = True) -> tuple[str, int]:
    """Search until the model answers (or steps run out). Returns (answer, searches made)."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps!r}")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question},
    ]
    searches = 0
    for _ in range(max_steps):
        kwargs: dict[str, Any] = {"tools": TOOLS} if use_tools else {}
        reply = client.chat.completions.create(model=model, messages=messages, temperature=temperature,
                                               max_tokens=max_tokens, **kwargs)
        message = reply.choices[0].message
        action, argument, call_id = parse_action(message)
        if action != "search":
            return argument, searches
        searches += 1
        result = search_tool(argument)
        if call_id is not None:
            messages.append({"role": "assistant", "content": message.content,
                             "tool_calls": [{"id": call_id, "type": "function",
                                             "function": {"name": "search",
                                                          "arguments": json.dumps({"query": argument})}}]})

            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            messages.append({"role": "assistant", "content": message.content or ""})
            messages.append({"role": "user", "content": f"Search results:\n{result}"})
    return "", searches


def episode(task: dict[str, Any], client: Any, model: str, sampling: dict[str, Any]) -> float:
    """One rollout; emits and returns the answer reward."""
    for name in ("question", "answer"):
        if not isinstance(task.get(name), str) or not task[name].strip():
            raise ValueError(f"task[{name!r}] must be a non-empty string, got {task.get(name)!r}")
    answer, _ = answer_question(
        client, model, task["question"], max_steps=int(task.get("max_steps", DEFAULT_MAX_STEPS)),
        temperature=float(sampling_value(sampling, task, "temperature", DEFAULT_TEMPERATURE)),
        max_tokens=int(sampling_value(sampling, task, "max_tokens", DEFAULT_MAX_TOKENS)),
        use_tools=bool(task.get("use_tools", True)))
    reward = answer_reward(answer, task["answer"])
    spanrl.emit_reward(reward)
    return reward


def agent(task: dict[str, Any], llm: Any = None) -> None:
    """The trainer's callable form (the reward goes out as a span)."""
    settings = llm_settings(llm)
    episode(task, settings.client(), settings.model, settings.sampling)


if __name__ == "__main__":
    sys.exit(serve(episode))

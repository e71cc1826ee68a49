"""The calculator agent: a plain OpenAI-client program, trained by spanrl from its traces.

Run it under ``opentelemetry-instrument`` (``opentelemetry-instrument python -m spanrl.demo.calculator.agent``,
or ``examples/calculator/agent.py`` from a checkout) (the spanrl distro exports to the collector and the OpenAI
instrumentor records each call); the trainer sets the environment. Two ways to be started:

- once per rollout: reads ``SPANRL_TASK`` (JSON), ``OPENAI_BASE_URL``, ``SPANRL_SAMPLING``; one rollout.
- as a worker (``SPANRL_AGENT_PROTOCOL=jsonl``): reads one rollout per line on stdin (JSON with
  ``rollout_id``, ``task_id``, ``task``, ``attempt``, ``mode``, ``base_url``, ``model``, ``sampling``),
  runs it inside ``spanrl.rollout(...)``, flushes its spans and answers ``{"spanrl_done": ROLLOUT_ID}``
  on stdout (the trainer then waits until the rollout's spans are stored). One process then serves many
  rollouts, which saves the ~1 s start-up of each.


Each rollout: ask the model (tools = the four operations), run the tool it calls, emit the reward.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import openai
from opentelemetry import trace

import spanrl
from spanrl.instrumentation import flush
from spanrl.demo.calculator.tasks import TOOL_SCHEMAS, apply_tool, parse_call, reward

__all__ = ["DEFAULT_MODEL", "MAX_COMPLETION_TOKENS", "main", "run_rollout", "serve_stdin"]

MAX_COMPLETION_TOKENS = 8
DEFAULT_MODEL = "policy"
_tracer = trace.get_tracer("spanrl.examples.calculator")


def _call_of(message: Any) -> tuple[str, list[int]] | None:
    """The tool call in an assistant message: OpenAI ``tool_calls`` first, else ``<call>`` text."""
    for tool_call in getattr(message, "tool_calls", None) or []:
        try:
            arguments = json.loads(tool_call.function.arguments or "{}")
            if isinstance(arguments, dict):
                values = list(arguments.values())
            else:
                values = list(arguments)
            return tool_call.function.name, [int(v) for v in values]
        except (TypeError, ValueError):
            return None
    return parse_call(getattr(message, "content", None))


def run_rollout(client: openai.OpenAI, task: dict[str, Any], *, model: str, sampling: dict[str, Any]) -> float:
    """One episode: one LLM call, the tool, the reward (also emitted as a span). Returns the reward."""
    response = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": task["question"]}],
        tools=TOOL_SCHEMAS,
        max_tokens=int(sampling.get("max_tokens", MAX_COMPLETION_TOKENS)),
        temperature=float(sampling.get("temperature", 1.0)),
    )
    call = _call_of(response.choices[0].message)
    if call is not None:
        with _tracer.start_as_current_span(f"execute_tool {call[0]}") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", call[0])
            span.set_attribute("gen_ai.tool.call.arguments", json.dumps(call[1]))
            try:
                span.set_attribute("gen_ai.tool.call.result", str(apply_tool(call[0], *call[1])))
            except (TypeError, ValueError) as exc:
                span.set_attribute("gen_ai.tool.call.result", f"error: {exc}")
    value = reward(task, call)
    spanrl.emit_reward(value)
    return value


def serve_stdin() -> None:
    """Worker mode: one rollout per stdin line, one ``spanrl_done`` line per rollout on stdout."""
    # One HTTP client for every rollout: each rollout has its own base URL, and a new OpenAI client builds
    # an SSL context (loads the CA bundle: ~35 ms of CPU), which was half of a worker's CPU in the demo.
    shared: openai.OpenAI | None = None
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        base_url = job["base_url"]
        shared = shared or openai.OpenAI(base_url=base_url, api_key=job.get("api_key", "spanrl"), max_retries=0)
        client = shared.with_options(base_url=base_url)
        answer: dict[str, Any] = {"spanrl_done": job["rollout_id"]}
        try:
            with spanrl.rollout(
                rollout_id=job["rollout_id"], task_id=job["task_id"], attempt=job.get("attempt"), mode=job.get("mode")
            ):
                answer["reward"] = run_rollout(
                    client, job["task"], model=job.get("model", DEFAULT_MODEL), sampling=job.get("sampling", {})
                )
        except Exception as exc:  # the trainer records it and retries; the worker lives on
            answer["error"] = f"{type(exc).__name__}: {exc}"
        flush()  # "done" means the spans left this process: a worker killed next loses nothing
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def main() -> None:
    if os.environ.get("SPANRL_AGENT_PROTOCOL") == "jsonl":
        serve_stdin()
        # Every rollout's spans were flushed before its answer: skip the interpreter's teardown of the openai
        # package's thousands of classes (~0.5 s of CPU, at each of the demo's stages for each worker).
        sys.stdout.flush()
        os._exit(0)
    task = json.loads(os.environ["SPANRL_TASK"])
    sampling = json.loads(os.environ.get("SPANRL_SAMPLING") or "{}")
    # OPENAI_BASE_URL from the environment; a local server needs no key, so run by hand it works without one
    client = openai.OpenAI(api_key=os.environ.get("OPENAI_API_KEY") or "spanrl", max_retries=0)
    print(run_rollout(client, task, model=os.environ.get("SPANRL_MODEL", DEFAULT_MODEL), sampling=sampling))


if __name__ == "__main__":
    main()

"""A production agent that knows nothing of spanrl: a plain OpenAI client under ``opentelemetry-instrument``.

Nothing here imports spanrl or sends a spanrl id. Each request is one conversation; the agent names it the
way OpenAI's API and the OTel GenAI conventions do: ``metadata={"conversation_id": ...}`` on the request
(the policy server records it as ``gen_ai.conversation.id``) and ``gen_ai.conversation.id`` on its own
span. The standard OpenAI instrumentor records the call and sends the trace context; the store makes
each conversation one rollout (``docs/conventions.md``, "Rollouts without spanrl ids")::

    opentelemetry-instrument python examples/production/plain_agent.py --server http://127.0.0.1:8000 \\
        --name agent-a --rate 4 --request-log requests-a.jsonl

It appends one JSON line per request to ``--request-log``: the conversation id, the completion's
response id (what ``plain_feedback.py`` judges), the answer and the policy version it came from.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import openai
from opentelemetry import trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from colors import task_for  # noqa: E402

_tracer = trace.get_tracer("plain-agent")


def serve_one(client: openai.OpenAI, name: str, n: int, model: str, max_tokens: int) -> dict:
    """One request = one conversation. Returns what the agent logs about it."""
    task = task_for(n)
    conversation = f"{name}-{n}"
    with _tracer.start_as_current_span("answer", attributes={"gen_ai.conversation.id": conversation}):
        response = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": task["question"]}], max_tokens=max_tokens,
            temperature=1.0, metadata={"conversation_id": conversation},
        )
    answer = response.choices[0].message.content or ""
    version = (response.model_extra or {}).get("policy_version")  # the policy server's extra field
    return {"conversation_id": conversation, "task_id": task["id"], "response_id": response.id, "answer": answer,
            "policy_version": version, "time": time.time()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="policy server URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--name", default="agent", help="prefix of this agent's conversation ids")
    parser.add_argument("--rate", type=float, default=2.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: never)")
    parser.add_argument("--request-log", required=True, help="JSONL file to append each request's ids and answer to")
    parser.add_argument("--model", default="policy")
    parser.add_argument("--max-tokens", type=int, default=3)
    args = parser.parse_args(argv)
    client = openai.OpenAI(base_url=f"{args.server.rstrip('/')}/v1", api_key="unused", max_retries=5)
    started, n = time.monotonic(), 0
    with open(args.request_log, "a") as log:
        while args.seconds is None or time.monotonic() - started < args.seconds:
            try:
                record = serve_one(client, args.name, n, args.model, args.max_tokens)
            except openai.OpenAIError as exc:  # a production agent keeps serving
                print(f"{args.name}: request {n} failed: {exc}", file=sys.stderr)
            else:
                log.write(json.dumps(record) + "\n")
                log.flush()
            n += 1
            time.sleep(max(0.0, started + n / args.rate - time.monotonic()))  # a steady rate, not back to back
    return 0  # opentelemetry-instrument's SDK flushes its spans at exit


if __name__ == "__main__":
    raise SystemExit(main())

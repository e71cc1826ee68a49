"""A production agent: serves requests at a steady rate against a policy server; no trainer starts it.

Run it under ``opentelemetry-instrument`` (the spanrl distro exports spans to the collector at
``OTEL_EXPORTER_OTLP_ENDPOINT``; the OpenAI instrumentor records each call)::

    opentelemetry-instrument python examples/production/agent.py --server http://127.0.0.1:8000 \\
        --name agent-a --rate 4 --request-log requests-a.jsonl

Each request is one rollout: ``spanrl.rollout(...)`` opens its root span; the policy server learns the
rollout from the ``x-spanrl-rollout-id`` header. The agent does not know the reward: users judge the
answer later (``feedback.py``). It appends one JSON line per request to ``--request-log`` with the ids a
feedback service can key on (rollout id, the completion's response id, the trace id) and the policy
version the response carried.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import openai
from opentelemetry import trace

import spanrl
from spanrl.instrumentation import flush

sys.path.insert(0, str(Path(__file__).resolve().parent))
from colors import task_for  # noqa: E402


def serve_one(client: openai.OpenAI, name: str, n: int, model: str, max_tokens: int) -> dict:
    """One request = one rollout. Returns what the agent logs about it."""
    task = task_for(n)
    rollout_id = f"{name}-{n}"
    with spanrl.rollout(rollout_id=rollout_id, task_id=task["id"]):
        trace_id = f"{trace.get_current_span().get_span_context().trace_id:032x}"
        response = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": task["question"]}], max_tokens=max_tokens,
            temperature=1.0, extra_headers={"x-spanrl-rollout-id": rollout_id, "x-spanrl-task-id": task["id"]},
        )
    answer = response.choices[0].message.content or ""
    version = (response.model_extra or {}).get("policy_version")
    return {"rollout_id": rollout_id, "task_id": task["id"], "response_id": response.id, "trace_id": trace_id,
            "answer": answer, "policy_version": version, "time": time.time()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="policy server URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--name", default="agent", help="prefix of this agent's rollout ids")
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
    flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

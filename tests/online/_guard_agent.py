"""A production agent for the guard test: requests at a steady rate, each one rollout, judged at once.

The user's verdict is how varied the answer is (distinct words / max_tokens, a continuous reward), and 0
for an answer that repeats the previous one word for word: the tiny random model samples nearly uniformly
and scores about 0.5; a model one huge step has ruined is all but greedy (its logits are huge), answers the
same words every time and scores about 0, whatever words its one answer holds. It sends the verdict by
rollout id with ``spanrl.emit_feedback`` and logs one JSON line per request (rollout id, policy version,
reward).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import openai

import spanrl
from spanrl.instrumentation import configure, flush


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--rate", type=float, default=8.0)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--log", required=True)
    args = parser.parse_args(argv)
    configure(service_name=f"guard-{args.name}")
    client = openai.OpenAI(base_url=f"{args.server}/v1", api_key="unused", max_retries=5)
    started, n, previous = time.monotonic(), 0, None
    with open(args.log, "a") as log:
        while True:
            rollout_id = f"{args.name}-{n}"
            try:
                with spanrl.rollout(rollout_id=rollout_id, task_id="vary"):
                    response = client.chat.completions.create(
                        model="policy", messages=[{"role": "user", "content": "w1 w2"}], max_tokens=args.max_tokens,
                        temperature=1.0, extra_headers={"x-spanrl-rollout-id": rollout_id, "x-spanrl-task-id": "vary"})
            except openai.OpenAIError as exc:
                print(f"{args.name}: request {n} failed: {exc}", file=sys.stderr)
            else:
                answer = response.choices[0].message.content or ""
                reward = 0.0 if answer == previous else len(set(answer.split())) / args.max_tokens
                previous = answer
                spanrl.emit_feedback(reward, rollout_id=rollout_id)
                version = (response.model_extra or {}).get("policy_version")
                log.write(json.dumps({"rollout_id": rollout_id, "policy_version": version, "reward": reward}) + "\n")
                log.flush()
                if n % 8 == 7:
                    flush()
            n += 1
            time.sleep(max(0.0, started + n / args.rate - time.monotonic()))


if __name__ == "__main__":
    raise SystemExit(main())

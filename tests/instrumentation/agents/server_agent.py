"""A long-lived agent serving several rollouts in one process: each wrapped in spanrl.rollout()."""

import sys

import openai

import spanrl

client = openai.OpenAI()

for rollout_id in sys.argv[1:]:
    with spanrl.rollout(rollout_id=rollout_id, task_id="task-" + rollout_id):
        with spanrl.agent("solver"):
            reply = client.chat.completions.create(model="tiny-calc", messages=[{"role": "user", "content": "2+3?"}])
            spanrl.emit_tool_call("check", {"answer": reply.choices[0].message.content}, "ok")
        spanrl.emit_reward({"correct": 1.0, "format": 0.5})

"""What the learned critic (``CreditConfig.critic``, ``algorithms/value_head.py``) costs against the GRPO update.

    .venv/bin/python bench/value_head_cost.py --model tiny|smollm2 [--tasks 4] [--group 8] [--repeats 3] [--depth D]

A batch shaped like ``demo/smollm2/agentic.py``'s (its defaults: 4 tasks x 8 rollouts, 2 calls each): call 0's
prompt is a shared system prompt and the task's question, its completion a tool call; call 1's prompt extends
call 0's conversation by the tool's result, its completion the answer (random token ids of the given lengths).
The update trains on it as the example does (``--aggregate``, its default: one merged sample per episode, the tool
result masked) or one sample per call (``--no-aggregate``); GRPOConfig's defaults otherwise (bf16 where fast,
prefix sharing). The critic's cost is what a training step adds: `HeadCritic.value_calls` over every call's
prompt (the no-grad backbone forward) and `HeadCritic.fit` (``epochs`` AdamW steps of the head), on the same
batch. Timed alternately, ``--repeats`` times each, after one untimed warm-up of each, in this process's CPU time
(``time.process_time``: all its threads; on a loaded machine wall time measures the neighbours); medians reported,
wall times beside them, with the machine's load before and after (``os.getloadavg``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

SYSTEM, QUESTION, TOOL_CALL, TOOL_RESULT, ANSWER = 200, 20, 30, 10, 5
"""Token lengths of the synthetic episode's parts."""


def model_folder(name: str, out: Path) -> Path:
    if name == "tiny":
        from spanrl.demo.tiny import build_tiny_model

        return build_tiny_model(out / "tiny", words=[f"w{i}" for i in range(64)], seed=0)
    from spanrl.serving.models import SMOLLM2, resolve_model

    return resolve_model(SMOLLM2)


def episodes(vocab: int, tasks: int, group: int, seed: int) -> list[dict[str, Any]]:
    """Per rollout: its two calls' prompt and completion ids."""
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    system, out = ids(SYSTEM), []
    for task in range(tasks):
        question = ids(QUESTION)
        for i in range(group):
            call, result, answer = ids(TOOL_CALL), ids(TOOL_RESULT), ids(ANSWER)
            out.append({"rollout_id": f"t{task}-{i}", "task_id": f"t{task}", "prompt0": system + question,
                        "call": call, "result": result, "answer": answer})
    return out


def calls_table(eps: list[dict[str, Any]]) -> pa.Table:
    """The calls as load_transitions hands them to the critic: one row per call."""
    rows = []
    for e in eps:
        rows.append({"rollout_id": e["rollout_id"], "step": 0, "agent": None, "prompt_ids": e["prompt0"]})
        rows.append({"rollout_id": e["rollout_id"], "step": 1, "agent": None,
                     "prompt_ids": e["prompt0"] + e["call"] + e["result"]})
    return pa.Table.from_pylist(rows)


def update_batch(eps: list[dict[str, Any]], aggregate: bool, seed: int) -> Any:
    from spanrl.algorithms.transitions import TRANSITIONS_SCHEMA, TransitionBatch

    rng = random.Random(seed)
    rows = []
    for e in eps:
        adv = [rng.gauss(0, 1), rng.gauss(0, 1)]
        base = {"rollout_id": e["rollout_id"], "task_id": e["task_id"], "attempt": 0, "agent": None, "reward": 1.0,
                "policy_version": 0, "retokenized": False, "temperature": 1.0}
        parts = [(e["prompt0"], e["call"], adv[0]), (e["prompt0"] + e["call"] + e["result"], e["answer"], adv[1])]
        if aggregate:
            completion = e["call"] + e["result"] + e["answer"]
            mask = [1] * TOOL_CALL + [0] * TOOL_RESULT + [1] * ANSWER
            rows.append({**base, "step": 0, "prompt_ids": e["prompt0"], "completion_ids": completion,
                         "completion_mask": mask, "old_logprobs": [-1.0 * m for m in mask], "advantage": adv[0],
                         "token_advantages": [adv[0]] * TOOL_CALL + [0.0] * TOOL_RESULT + [adv[1]] * ANSWER})
            continue
        for step, (prompt, completion, a) in enumerate(parts):
            rows.append({**base, "step": step, "prompt_ids": prompt, "completion_ids": completion,
                         "completion_mask": [1] * len(completion), "old_logprobs": [-1.0] * len(completion),
                         "advantage": a, "token_advantages": []})
    return TransitionBatch(pa.Table.from_pylist(rows, schema=TRANSITIONS_SCHEMA), {}, {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--aggregate", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--depth", type=float, default=None, help="CriticConfig.depth (default: its default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from spanrl.algorithms.grpo import GRPO
    from spanrl.algorithms.learned_credit import CriticConfig
    from spanrl.algorithms.value_head import head_critic

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        algo = GRPO(learning_rate=1e-6)
        algo.setup(model_path=model_folder(args.model, Path(tmp)), output_dir=Path(tmp) / "run", seed=0)
        eps = episodes(algo.model.config.vocab_size, args.tasks, args.group, seed=0)
        calls, batch = calls_table(eps), update_batch(eps, args.aggregate, seed=1)
        returns = np.random.default_rng(0).random(calls.num_rows)
        cpu: dict[str, list[float]] = {"update": [], "forward": [], "fit": []}
        wall: dict[str, list[float]] = {"update": [], "forward": [], "fit": []}
        for i in range(args.repeats + 1):  # the first of each: a warm-up, not counted
            critic = head_critic(algo, CriticConfig(**({} if args.depth is None else {"depth": args.depth})))
            for name, job in (("update", lambda: algo.update(batch)), ("forward", lambda: critic.value_calls(calls)),
                              ("fit", lambda: (critic.observe_returns(returns), critic.fit()))):
                cpu0, wall0 = time.process_time(), time.perf_counter()
                job()
                if i:
                    cpu[name].append(time.process_time() - cpu0)
                    wall[name].append(time.perf_counter() - wall0)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    print(json.dumps({
        "model": args.model, "calls": calls.num_rows, "update_rows": len(batch), "aggregate": args.aggregate,
        "bf16": algo.bf16, "threads": torch.get_num_threads(), "depth": critic.config.depth,
        "cpu_s": {k: round(v, 3) for k, v in med.items()},
        "critic_over_update_cpu": round((med["forward"] + med["fit"]) / med["update"], 4),
        "cpu_s_each": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
        "wall_s_each": {k: [round(x, 3) for x in v] for k, v in wall.items()},
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

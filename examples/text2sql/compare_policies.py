"""Writer + checker text-to-SQL on SmolLM2-135M: one LoRA adapter per agent against one shared adapter.

    python examples/text2sql/compare_policies.py --arm per-agent --seed 0 --out runs/t2s-agents-0
    python examples/text2sql/compare_policies.py --arm shared    --seed 0 --out runs/t2s-shared-0

Both arms train the same LoRA rank with the same update (``MultiLoRA``), learning rate, steps and rollouts (equal
budgets); ``shared`` routes every call to one adapter, ``per-agent`` the writer's calls to the writer's adapter and
the checker's to the checker's. The agent is ``multi_agent.py`` run in process; each role asks for its own model.
After training, each held-out question is played greedily and scored: the writer's first-try success (its first
query's execution match), the checker's catch rate (a wrong first query it sends back) and false alarms (a right one
it sends back), and the final success after one review round. Writes ``result.json`` and prints one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.text2sql import multi_agent
from examples.text2sql.agent import write_sql
from examples.text2sql.sqltools import execution_reward, load_questions


@dataclasses.dataclass
class CompareConfig:
    """One arm's budget (both arms get the same)."""

    arm: str = "per-agent"
    """``per-agent`` (an adapter per role) or ``shared`` (one adapter for both roles)."""
    output_dir: str = "runs/text2sql-agents"
    steps: int = 4
    tasks_per_step: int = 4
    group: int = 4
    learning_rate: float = 1e-4
    lora_r: int = 8
    n_val: int = 24
    n_train: int = 64
    tries: int = 2
    max_tokens: int = 80
    seed: int = 0


def _tasks(split: str, n: int, seed: int, cfg: CompareConfig) -> list[dict[str, Any]]:
    pool = [q for q in load_questions(split) if q["difficulty"] <= 2]
    chosen = random.Random(seed).sample(pool, min(n, len(pool)))
    return [dict(q, prompt_style="full", max_tries=cfg.tries, max_tokens=cfg.max_tokens, review_rounds=1)
            for q in chosen]


def _play(client: Any, models: dict[str, str], task: dict[str, Any], cfg: CompareConfig) -> tuple[bool, bool, bool]:
    """One greedy episode: (first query right, checker accepted it, final query right)."""
    question, gold = task["question"], task["sql"]
    sql, result, _ = write_sql(client, models["writer"], question, max_tries=1, temperature=0.0,
                               max_tokens=cfg.max_tokens)
    ok = execution_reward(sql, gold) == 1.0
    accepted, feedback = multi_agent.check_sql(client, models["checker"], question, sql, result, temperature=0.0,
                                               max_tokens=cfg.max_tokens)
    if not accepted:
        prompt = multi_agent.FEEDBACK_PROMPT.format(question=question, sql=sql, feedback=feedback)
        sql, result, _ = write_sql(client, models["writer"], prompt, max_tries=cfg.tries, temperature=0.0,
                                   max_tokens=cfg.max_tokens)
    return ok, accepted, execution_reward(sql, gold) == 1.0


def score(client: Any, models: dict[str, str], tasks: list[dict[str, Any]], cfg: CompareConfig) -> dict[str, Any]:
    """Greedy play of each task (8 at a time: the server batches them): first-try success, catch rate, false
    alarms, final success."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        played = list(pool.map(lambda t: _play(client, models, t, cfg), tasks))
    wrong = sum(not ok for ok, _, _ in played)
    right = len(played) - wrong
    caught = sum(not ok and not accepted for ok, accepted, _ in played)
    alarms = sum(ok and not accepted for ok, accepted, _ in played)
    n = len(tasks)
    return {"writer_first_try": right / n, "checker_catch_rate": caught / wrong if wrong else None,
            "checker_false_alarms": alarms / right if right else None,
            "final_success": sum(final for _, _, final in played) / n, "n": n}


def run(cfg: CompareConfig) -> dict[str, Any]:
    from spanrl.algorithms import GRPO, AgentPolicy, LightningRL, LoRAConfig
    from spanrl.serving.models import SMOLLM2, resolve_model
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

    started = time.perf_counter()
    lora = LoRAConfig(r=cfg.lora_r, alpha=2 * cfg.lora_r)
    roles = (multi_agent.WRITER, multi_agent.CHECKER)
    policies = ({r: AgentPolicy(lora=lora) for r in roles} if cfg.arm == "per-agent"
                else {"default": AgentPolicy(lora=lora)})
    trainer = Trainer(
        model=resolve_model(SMOLLM2), agent=multi_agent.agent, tasks=_tasks("train", cfg.n_train, cfg.seed, cfg),
        algorithm=GRPO(learning_rate=cfg.learning_rate, micro_batch_size=2), policies=policies,
        credit=LightningRL(mode="identical", baseline="grpo"),
        config=TrainerConfig(output_dir=cfg.output_dir, n_rollouts=cfg.group, tasks_per_step=cfg.tasks_per_step,
                             max_steps=cfg.steps, temperature=1.0, max_tokens=cfg.max_tokens, eval_at_start=False,
                             seed=cfg.seed, progress=True, torch_threads=2, server_max_batch_size=32,
                             runner=RunnerConfig(max_concurrency=cfg.group * cfg.tasks_per_step,
                                                 rollout_timeout_s=900.0, span_timeout_s=60.0)),
    )
    history = trainer.train()
    default, per_role = trainer.algorithm.rollout_models()
    models = {r: per_role.get(r, default) for r in roles}
    try:
        scores = score(trainer.deploy(), models, _tasks("val", cfg.n_val, cfg.seed + 1, cfg), cfg)
    finally:
        trainer.close()
    updates = [row["time/update_s"] for row in history if row.get("time/update_s")]
    result = {"arm": cfg.arm, **scores, "update_s_median": statistics.median(updates) if updates else None,
              "train_reward_by_step": [row.get("reward_mean") for row in history],
              "seconds": time.perf_counter() - started, "config": dataclasses.asdict(cfg)}
    Path(cfg.output_dir, "result.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = CompareConfig()
    parser.add_argument("--arm", choices=("per-agent", "shared"), default=d.arm)
    parser.add_argument("--out", default=d.output_dir)
    for name in ("steps", "tasks_per_step", "group", "n_val", "seed", "lora_r"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    parser.add_argument("--lr", type=float, default=d.learning_rate)
    args = parser.parse_args(argv)
    cfg = CompareConfig(arm=args.arm, output_dir=args.out, steps=args.steps, tasks_per_step=args.tasks_per_step,
                        group=args.group, n_val=args.n_val, seed=args.seed, lora_r=args.lora_r,
                        learning_rate=args.lr)
    from spanrl.logs import log_to_file

    print(f"full logs: {log_to_file(Path(cfg.output_dir) / 'spanrl.log')}")
    r = run(cfg)
    print(json.dumps({k: v for k, v in r.items() if k not in ("config", "train_reward_by_step")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

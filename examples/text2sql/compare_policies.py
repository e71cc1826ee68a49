"""Writer + checker text-to-SQL on SmolLM2-135M: one LoRA adapter per agent against one shared adapter.

    python examples/text2sql/compare_policies.py --arm per-agent --seed 0 --out runs/t2s-agents-0
    python examples/text2sql/compare_policies.py --arm shared    --seed 0 --out runs/t2s-shared-0

Both arms start from one SFT warm start (``warm_start``: all weights, on the careless writer + checker
demonstrator's episodes; built once in ``--sft-dir`` and reused), then train the same LoRA rank with the same update
(``MultiLoRA``), learning rate, steps and rollouts (equal budgets); ``shared`` routes every call to one adapter,
``per-agent`` the writer's calls to the writer's adapter and the checker's to the checker's. The agent is
``multi_agent.py`` run in process; each role asks for its own model. After training, each held-out question is
played greedily and scored: the writer's first-try success (its first query's execution match), the checker's catch
rate (a wrong first query it sends back) and false alarms (a right one it sends back), and the final success after
one review round. Writes ``result.json`` and prints one line.
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
from examples.text2sql.demonstrator import CHECKER_CATCH_RATE
from examples.text2sql.sqltools import execution_reward, load_questions

WRITER, CHECKER = multi_agent.WRITER, multi_agent.CHECKER
VAL_SEED = 1  # the held-out sample does not move with --seed


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
    n_val: int = 48
    """Held-out questions, the same for every arm and seed (and the warm start)."""
    n_train: int = 64
    tries: int = 2
    max_tokens: int = 80
    seed: int = 0
    sft_dir: str = "runs/t2s-sft"
    """The SFT warm start's folder: built once (seed 0), reused by every arm and seed when it holds a checkpoint."""
    sft_epochs: int = 3
    sft_learning_rate: float = 1e-4
    checker_catch_rate: float = CHECKER_CATCH_RATE
    """How often the demonstrated checker objects to a wrong query (the warm start's; a new ``sft_dir`` for another)."""


def _tasks(split: str, n: int, seed: int, cfg: CompareConfig) -> list[dict[str, Any]]:
    pool = [q for q in load_questions(split) if q["difficulty"] <= 2]
    chosen = random.Random(seed).sample(pool, min(n, len(pool)))
    return [dict(q, prompt_style="full", max_tries=cfg.tries, max_tokens=cfg.max_tokens, review_rounds=1)
            for q in chosen]


def _play(client: Any, models: dict[str, str], task: dict[str, Any], cfg: CompareConfig) -> tuple[bool, bool, bool]:
    """One greedy episode: (first query right, checker accepted it, final query right)."""
    question, gold = task["question"], task["sql"]
    sql, result, _ = write_sql(client, models[WRITER], question, max_tries=1, temperature=0.0,
                               max_tokens=cfg.max_tokens)
    ok = execution_reward(sql, gold) == 1.0
    accepted, feedback = multi_agent.check_sql(client, models[CHECKER], question, sql, result, temperature=0.0,
                                               max_tokens=cfg.max_tokens)
    if not accepted:
        prompt = multi_agent.FEEDBACK_PROMPT.format(question=question, sql=sql, feedback=feedback)
        sql, result, _ = write_sql(client, models[WRITER], prompt, max_tries=cfg.tries, temperature=0.0,
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


def warm_start(cfg: CompareConfig) -> Path:
    """SFT of SmolLM2 (all weights) on the careless writer + checker demonstrator's episodes over the training
    questions, one per question; returns the checkpoint both arms start from. SmolLM2 alone writes no right
    query (0 of 32 rollouts), so without it every GRPO advantage is 0 and the arms cannot differ."""
    from examples._teacher import TeacherServer
    from examples.text2sql.demonstrator import WriterCheckerDemonstrator
    from spanrl.algorithms.sft import SFT
    from spanrl.serving.models import SMOLLM2, resolve_model
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

    out = Path(cfg.sft_dir)
    tasks = _tasks("train", cfg.n_train, 0, cfg)
    with TeacherServer(WriterCheckerDemonstrator(tasks, catch_rate=cfg.checker_catch_rate), seed=0) as teacher:
        sft = Trainer(
            model=resolve_model(SMOLLM2), agent=multi_agent.agent, tasks=tasks,
            algorithm=SFT(learning_rate=cfg.sft_learning_rate, epochs=cfg.sft_epochs, batch_size=8,
                          reward_threshold=None),  # imitate every call, the mistakes included
            config=TrainerConfig(output_dir=str(out), llm_url=teacher.url, n_rollouts=1, tasks_per_step=len(tasks),
                                 max_steps=1, eval_at_start=False, seed=0, progress=True, torch_threads=2,
                                 max_tokens=cfg.max_tokens,
                                 runner=RunnerConfig(max_concurrency=8, require_token_spans=False)),
        )
        if sft.latest_checkpoint() is None:
            sft.train()
    checkpoint = sft.latest_checkpoint()
    if checkpoint is None:
        raise RuntimeError(f"the SFT warm start in {out} wrote no checkpoint")
    if not (out / "start.json").exists():  # the arms' common starting point, scored like them
        try:
            client = sft.deploy()
            served = client.models.list().data[0].id
            scores = score(client, {WRITER: served, CHECKER: served}, _tasks("val", cfg.n_val, VAL_SEED, cfg), cfg)
        finally:
            sft.close()
        (out / "start.json").write_text(json.dumps(scores, indent=1))
    return Path(checkpoint)


def run(cfg: CompareConfig) -> dict[str, Any]:
    from spanrl.algorithms import GRPO, AgentPolicy, LightningRL, LoRAConfig
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

    started = time.perf_counter()
    start = warm_start(cfg)
    lora = LoRAConfig(r=cfg.lora_r, alpha=2 * cfg.lora_r)
    roles = (WRITER, CHECKER)
    policies = ({r: AgentPolicy(lora=lora) for r in roles} if cfg.arm == "per-agent"
                else {"default": AgentPolicy(lora=lora)})
    trainer = Trainer(
        model=start, agent=multi_agent.agent, tasks=_tasks("train", cfg.n_train, cfg.seed, cfg),
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
        scores = score(trainer.deploy(), models, _tasks("val", cfg.n_val, VAL_SEED, cfg), cfg)
    finally:
        trainer.close()
    updates = [row["time/update_s"] for row in history if row.get("time/update_s")]
    start_scores = json.loads(Path(cfg.sft_dir, "start.json").read_text())
    result = {"arm": cfg.arm, **scores, "start": start_scores,
              "update_s_median": statistics.median(updates) if updates else None,
              "train_reward_by_step": [row.get("reward_mean") for row in history],
              "seconds": time.perf_counter() - started, "config": dataclasses.asdict(cfg)}
    Path(cfg.output_dir, "result.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = CompareConfig()
    parser.add_argument("--arm", choices=("per-agent", "shared"), default=d.arm)
    parser.add_argument("--out", default=d.output_dir)
    for name in ("steps", "tasks_per_step", "group", "n_val", "seed", "lora_r", "n_train", "sft_epochs"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    parser.add_argument("--lr", type=float, default=d.learning_rate)
    parser.add_argument("--checker-catch-rate", type=float, default=d.checker_catch_rate)
    parser.add_argument("--sft-dir", default=d.sft_dir, help="the warm start's folder, built once and shared")
    args = parser.parse_args(argv)
    cfg = CompareConfig(arm=args.arm, output_dir=args.out, steps=args.steps, tasks_per_step=args.tasks_per_step,
                        group=args.group, n_val=args.n_val, seed=args.seed, lora_r=args.lora_r,
                        learning_rate=args.lr, n_train=args.n_train, sft_epochs=args.sft_epochs, sft_dir=args.sft_dir,
                        checker_catch_rate=args.checker_catch_rate)
    from spanrl.logs import log_to_file

    print(f"full logs: {log_to_file(Path(cfg.output_dir) / 'spanrl.log')}")
    r = run(cfg)
    print(json.dumps({k: v for k, v in r.items() if k not in ("config", "train_reward_by_step")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""APO's loop: a beam search over prompt templates, each scored by rollouts, no weight updates.

``Trainer(algorithm=APO(...), prompt_template=...).train()`` runs :func:`search_prompt` instead of the
weight loop, through the Trainer's public methods (``run_rollouts``, ``final_rewards``, ``record``). Every
candidate is scored on the same ``tasks_per_step`` tasks (sampled once with the seed), ``n_rollouts``
rollouts each: the mean final reward, a failed rollout counting 0. Each candidate is one history row; the
best template is kept in ``trainer.prompt_template`` and written, with the search's scores, to
``apo_result.json``.
"""

from __future__ import annotations

import json
import random
import time
from typing import TYPE_CHECKING, Any

from spanrl.rollouts.rollouts import jobs_of
from spanrl.trainer.config import APO_RESULT_FILE

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.trainer.trainer import Trainer

__all__ = ["search_prompt"]

_EXAMPLE_CHARS = 200  # of each task shown to the critic


def search_prompt(trainer: Trainer) -> None:
    """Run ``trainer.algorithm.optimize`` from ``trainer.prompt_template``; record rows; keep the best."""
    from spanrl.algorithms.apo import Evaluation

    cfg = trainer.config
    chosen = random.Random(cfg.seed).sample(jobs_of(trainer.tasks), cfg.tasks_per_step)
    jobs = [job for job in chosen for _ in range(cfg.n_rollouts)]
    tasks = {job.task_id: job.task for job in chosen}

    def score(template: str) -> Evaluation:
        started = time.perf_counter()
        step = trainer.step + 1
        results = trainer.run_rollouts(jobs, tag=f"p{step}", mode="train", template=template)
        ok = [r for r in results if r.ok]
        rewards = trainer.final_rewards([r.rollout_id for r in ok])
        outcomes = sorted((rewards.get(r.rollout_id) or 0.0, r.task_id) for r in ok)
        mean = sum(reward for reward, _ in outcomes) / len(jobs)  # a rollout that never succeeded counts 0
        trainer.record({
            "step": step, "rollouts_ok": len(ok), "rollouts_failed": sum(not r.ok for r in results),
            "reward_mean": mean, "prompt_template": template, "time/step_s": time.perf_counter() - started,
        })
        examples = [
            f"task {json.dumps(tasks[task_id])[:_EXAMPLE_CHARS]} -> reward {reward:g}" for reward, task_id in outcomes
        ]

        return Evaluation(score=mean, examples=examples)

    result = trainer.algorithm.optimize(trainer.prompt_template, score)
    result.save(trainer.output_dir / APO_RESULT_FILE)
    trainer.apo_result, trainer.prompt_template = result, result.best_template
    row: dict[str, Any] = {
        "step": trainer.step, "apo/initial_score": result.initial_score, "apo/best_score": result.best_score,
        "prompt_template": result.best_template,
    }
    if trainer.val_tasks:
        row["val_success"] = trainer.evaluate()
    trainer.record(row)

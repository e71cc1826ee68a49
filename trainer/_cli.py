"""``spanrl train CONFIG.yaml``. Handlers import the heavy modules lazily.

What they print is for people: a progress bar and one line per step; every log line, Python warning
and third-party message goes to ``spanrl.log`` in the output folder (``--verbose`` shows them too).
The config's keys: :mod:`spanrl.trainer.train_config` and ``docs/train-config.md``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from spanrl.trainer.cli_output import log_file, output_options
from spanrl.trainer.train_config import DOCS, build_trainer, load_tasks, read_config
from spanrl.extras import needs_extra

__all__ = ["build_trainer", "load_tasks", "register"]

_SUMMARY_KEYS = ("reward_mean", "val_success", "apo/best_score", "prompt_template")
HELD_OUT = ("held-out success ('held-out' in the step lines): one greedy rollout per val_tasks task, the mean "
            "final reward, a failed rollout counting 0 (a success rate when rewards are 0 or 1).")
_NEVER_REWARDED = ("note: the reward was 0 at every step. A tiny random model almost never samples a right answer "
                   "longer than a word, so it has nothing to learn from: give the agent a warm start (SFT on "
                   "demonstrations, as `spanrl demo` does) or a real model (model: a Hugging Face folder).")


def register(subparsers: Any) -> None:
    train = subparsers.add_parser(
        "train", help="the training loop, from a YAML config",
        description="Train from a YAML (or JSON) config: model, agent, tasks, algorithm and the loop's settings.",
        epilog=f"Every key, its default and meaning: {DOCS} (`spanrl docs train-config`); each example ships a "
               "train.yaml (examples/*/train.yaml) that runs as is. "
               f"An unknown key is an error naming the nearest valid one. {HELD_OUT}",
    )
    train.add_argument("config", help="YAML or JSON file with the Trainer's settings")
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    train.add_argument("--overwrite", action="store_true",
                       help="start over in an output_dir holding an earlier run (its files are removed first)")
    train.add_argument("--output-dir", help="override output_dir")
    train.add_argument("--max-steps", type=int, help="override max_steps")
    train.add_argument("--json", action="store_true",
                       help="end with one JSON line summing the run up (for scripts)")
    train.add_argument("--plan", action="store_true",
                       help="print the estimated peak memory of the update and the server, part by part, and exit "
                            "(an error when it cannot fit: the run itself refuses such a config at start)")
    train.add_argument("--plan-prompt-tokens", type=int, default=512, metavar="N",
                       help="prompt length the plan assumes for each call (default 512)")
    output_options(train)
    train.set_defaults(func=_train)
    needs_extra(train, "train")


def _train(args: argparse.Namespace) -> int:
    path = Path(args.config)
    raw = read_config(path)
    if args.resume:
        raw["resume"] = True
    if args.overwrite:
        raw["overwrite"] = True
    if args.output_dir:
        raw["output_dir"] = str(Path(args.output_dir).resolve())
    if args.max_steps is not None:
        raw["max_steps"] = args.max_steps
    if args.no_progress:
        raw["progress"] = False
    from spanrl.trainer.config import TrainerConfig

    log_file(Path(str(raw.get("output_dir", TrainerConfig.output_dir))), args)
    trainer = build_trainer(raw, base=path.parent)
    plan = memory_plan(trainer, prompt_tokens=args.plan_prompt_tokens)
    if args.plan:
        print("\n".join(plan.lines()) if plan else "memory plan: this algorithm trains no weights (nothing to plan)")
    if plan:
        plan.check()
    if args.plan:
        return 0
    history = trainer.train()
    last = history[-1] if history else {}
    summary = {"step": trainer.step, "output_dir": str(trainer.output_dir),
               **{k: last[k] for k in _SUMMARY_KEYS if k in last}}
    print(_summary_line(summary))
    rewards = [row["reward_mean"] for row in history if row.get("reward_mean") is not None]
    if isinstance(raw.get("model"), dict) and rewards and not any(rewards):  # {tiny: ...}: the usual cause
        print(_NEVER_REWARDED)
    if args.json:
        print(json.dumps(summary))
    return 0


def memory_plan(trainer: Any, *, prompt_tokens: int) -> Any:
    """The :class:`~spanrl.algorithms.memory_plan.MemoryPlan` of ``trainer``'s update and embedded server, on the
    device the update runs on; a step's rows are ``tasks_per_step`` x ``n_rollouts`` (one call a rollout) of
    ``max_tokens`` completion tokens.
    None for an algorithm that updates no weights (APO), a model that is no HF folder, or an update across several
    processes (``WORLD_SIZE`` > 1: the plan is one process's)."""
    import torch

    from spanrl.algorithms.memory_plan import plan_memory

    cfg, serving = trainer.config, trainer.config.serving
    algorithm_config = getattr(trainer.algorithm, "config", None)
    if not hasattr(algorithm_config, "learning_rate") or not (Path(trainer.model_path) / "config.json").is_file():
        return None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # sharded or data-parallel updates: one process's plan is wrong
        return None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # the embedded server (always loaded: it evaluates) counts where it shares the update's device; vLLM takes the GPU
    shared = serving.backend == "vllm" or serving.device.split(":")[0] == device
    return plan_memory(trainer.model_path, algorithm_config, rows=cfg.tasks_per_step * cfg.n_rollouts,
                       device=device, prompt_tokens=prompt_tokens, embedded_server=shared,
                       completion_tokens=cfg.max_tokens,
                       serving_backend=serving.backend, serving_dtype=serving.dtype,
                       gpu_memory_utilization=serving.gpu_memory_utilization)


def _summary_line(summary: dict[str, Any]) -> str:
    parts = [f"done: {summary['step']} steps"]
    labels = (("reward_mean", "reward"), ("val_success", "held-out success"), ("apo/best_score", "best prompt score"))
    for key, label in labels:

        if isinstance(summary.get(key), (int, float)):
            parts.append(f"{label} {summary[key]:.2f}")
    return ", ".join(parts) + f"; output in {summary['output_dir']}"

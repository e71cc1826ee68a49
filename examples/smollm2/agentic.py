"""A real model learns a multi-step tool agent: SmolLM2-135M-Instruct calls a calculator through the
OpenAI tools API, reads the result and answers; GRPO on CPU through the whole pipeline.

    python examples/smollm2/agentic.py --out runs/smollm2-agentic
    python examples/smollm2/agentic.py --out runs/x --val-tasks my_tasks.jsonl   # your own held-out tasks
    python examples/smollm2/agentic.py --task calc-verify --out runs/calc-verify   # recoverable mistakes

The same run as ``spanrl demo --model smollm2``, with every knob: the agent, the task and its tools live
in the package (``spanrl.demo.smollm2.agentic``, ``spanrl.demo.smollm2.tools``). The terminal shows a
progress bar and one line per step; library messages go to ``OUT/spanrl.log``. Results in ``OUT``:
``result.json``, ``reward_curve.png``, ``history.jsonl``, ``spans.duckdb``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spanrl.errors import SpanRLError
from spanrl.demo.smollm2.agentic import CREDIT_MODES, MAX_CALLS, AgenticConfig, agent, build_trainer, run
from spanrl.demo.smollm2.verify_run import VerifyConfig

TASKS = {"tools": AgenticConfig, "calc-verify": VerifyConfig}
"""``--task``: the tool agent, or calc-verify (``spanrl.demo.smollm2.verify``: a wrong answer is rejected once)."""

__all__ = ["AgenticConfig", "MAX_CALLS", "agent", "build_trainer", "main", "run"]


def main(argv: list[str] | None = None) -> int:
    from spanrl.logs import log_to_file

    d = AgenticConfig()
    parser = argparse.ArgumentParser(description="SmolLM2-135M-Instruct, a calculator tool agent: held-out success "
                                                 "before and after GRPO")
    parser.add_argument("--task", choices=tuple(TASKS), default="tools",
                        help="tools: the calculator agent; calc-verify: a wrong answer rejected once, reward 0.6 a "
                             "call past two, held-out first-try success (defaults: --val 200, --eval-every 0, "
                             "--max-minutes 30, --out runs/smollm2-calc-verify)")
    parser.add_argument("--out", default=None, help=f"output folder (default {d.output_dir})")
    parser.add_argument("--model", default=None, help="model folder to start from (a checkpoint); --steps 0 scores it")
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--tasks-per-step", type=int, default=d.tasks_per_step)
    parser.add_argument("--group", type=int, default=d.group)
    parser.add_argument("--lr", type=float, default=d.learning_rate)
    parser.add_argument("--credit", choices=CREDIT_MODES, default=d.credit)
    parser.add_argument("--gamma", type=float, default=d.gamma, help="discount per call (discounted, step, gigpo)")
    parser.add_argument("--aggregate", action=argparse.BooleanOptionalAction, default=d.aggregate,
                        help="one sample per episode (trajectory_aggregation; each call keeps its own advantage on "
                             "its tokens); --no-aggregate: one sample per call")
    parser.add_argument("--temperature", type=float, default=d.temperature)
    parser.add_argument("--val", type=int, default=None, help=f"generated held-out tasks (default {d.n_val})")
    parser.add_argument("--val-tasks", default=None,
                        help="jsonl of held-out tasks: {\"question\": ..., \"answer\": ...}")
    parser.add_argument("--eval-every", type=int, default=None, help=f"default {d.eval_every}")
    parser.add_argument("--max-minutes", type=float, default=None, help=f"default {d.max_minutes}")
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--seed", type=int, default=d.seed, help="the tasks' seed (and the sampling seed)")
    parser.add_argument("--sampling-seed", type=int, default=None,
                        help="the Trainer's seed (sampling, task order) when not --seed: an A/A control")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="the policy server's prefix cache (a group's shared prompt tokens computed once)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar and step lines")
    args = parser.parse_args(argv)
    try:
        cfg = _config(args)
    except SpanRLError as exc:  # a bad setting or --val-tasks file: one line, before anything slow
        print(f"agentic.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"full logs: {log_to_file(Path(cfg.output_dir) / 'spanrl.log')}")
    if isinstance(cfg, VerifyConfig):
        return _calc_verify(cfg)
    result = run(cfg)
    print(f"held-out success ({result['n_val']} tasks, greedy): before {result['val_before']:.3f} -> after "
          f"{result['val_after']:.3f} ({result['steps']} steps, {result['rollouts']} rollouts, credit {cfg.credit}, "
          f"{result['seconds'] / 60:.1f} min)")
    print(f"curve: {Path(cfg.output_dir) / 'reward_curve.png'}; details: {Path(cfg.output_dir) / 'result.json'}")
    return 0


def _config(args: argparse.Namespace) -> AgenticConfig:
    fields = dict(output_dir=args.out, model=args.model, steps=args.steps, tasks_per_step=args.tasks_per_step,
                  group=args.group, learning_rate=args.lr, credit=args.credit, gamma=args.gamma,
                  aggregate=args.aggregate, temperature=args.temperature, n_val=args.val, val_tasks=args.val_tasks,
                  eval_every=args.eval_every, max_minutes=args.max_minutes, threads=args.threads,
                  progress=not args.no_progress, seed=args.seed,
                  sampling_seed=args.sampling_seed, prefix_caching=args.prefix_caching)
    # options left unset take the task's own defaults (--max-minutes cannot be set to None from here)
    return TASKS[args.task](**{k: v for k, v in fields.items() if v is not None}).validate()


def _calc_verify(cfg: VerifyConfig) -> int:
    from spanrl.demo.smollm2.verify_run import run as run_verify

    result = run_verify(cfg)
    for name in ("before", "after"):
        m = result[name]
        if m is None:
            continue
        recovery = "-" if m["recovery_rate"] is None else f"{m['recovery_rate']:.3f}"
        print(f"held-out {name} (step {m['step']}, {m['episodes']} tasks, greedy): first-try success "
              f"{m['first_try']:.3f}, final success {m['final_success']:.3f}, calls per episode "
              f"{m['calls_per_episode']:.2f}, recovery rate {recovery}")
    print(f"{result['steps']} steps, {result['rollouts']} rollouts, credit {cfg.credit}, "
          f"{result['seconds'] / 60:.1f} min; details: {Path(cfg.output_dir) / 'result.json'}; "
          f"credit audit: spanrl credit audit {cfg.output_dir} --mode train --config mode=identical ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())

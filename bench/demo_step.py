"""Where one GRPO step of the demo goes: rollouts, decompose, update, reload, evaluation.

The demo's GRPO stage (``spanrl demo`` settings: 16 tasks x 8 rollouts per step, 4 jsonl workers of the
calculator agent under opentelemetry-instrument, one torch thread, 100 held-out tasks evaluated greedily
every ``eval_every`` = 10 steps) on its tiny Llama (fresh: no SFT warm start; completions are capped at 8
tokens either way). Runs ``--steps`` steps with an evaluation every ``--eval-every`` steps (to time a few
evaluations) and reads the Trainer's own per-step timing fields from the history (``time/rollouts_s``,
``time/decompose_s``, ``time/update_s``, ``time/reload_s``, ``time/step_s``, ``time/eval_s``). Prints the
median of each stage over steps 2.. (step 1 warms up), its share of a demo step with the evaluation
spread over the demo's 10 steps, and steps/minute.

    .venv/bin/python bench/demo_step.py [--steps 6] [--eval-every 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # no third-party progress bars (model building) on screen
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations: not ours to show

from spanrl.demo import demo
from spanrl.demo.calculator import tasks as calculator
from spanrl.demo.tiny import build_tiny_model

_STAGES = ("rollouts", "decompose", "update", "reload")


def profile(steps: int, eval_every: int, out: Path) -> dict[str, float]:
    """Median seconds per stage (``eval``: per evaluation) and per step, from one demo GRPO run."""
    cfg = demo.DemoConfig(grpo_steps=steps, eval_every=eval_every, progress=False, output_dir=str(out))
    train_tasks, val_tasks = calculator.split_tasks(cfg.n_train_tasks, cfg.n_val_tasks, seed=cfg.seed)
    model = build_tiny_model(out / "model", words=calculator.vocabulary(), seed=cfg.seed)
    history = demo._grpo_trainer(dataclasses.replace(cfg, output_dir=str(out)), model, train_tasks, val_tasks).train()
    rows = [row for row in history if "time/step_s" in row][1:]
    medians = {k: statistics.median(row[f"time/{k}_s"] for row in rows) for k in (*_STAGES, "step")}
    medians["other"] = statistics.median(row["time/step_s"] - sum(row[f"time/{k}_s"] for k in _STAGES) for row in rows)
    medians["eval"] = statistics.median(row["time/eval_s"] for row in history if "time/eval_s" in row)
    return medians


def report(medians: dict[str, float], demo_eval_every: int = 10) -> None:
    """One line per stage: median seconds and share of a demo step (evaluation spread over its steps)."""
    per_step = {k: medians[k] for k in (*_STAGES, "other")} | {"eval/10": medians["eval"] / demo_eval_every}
    total = sum(per_step.values())
    for name, seconds in per_step.items():
        print(f"  {name:<10} {seconds:7.3f} s  {100 * seconds / total:5.1f}%")
    print(f"  one evaluation "
          f"{medians['eval']:.2f} s; step {medians['step']:.2f} s -> {60 / total:.2f} demo steps/minute "
          f"(evaluation included); load {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--eval-every", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report(profile(args.steps, args.eval_every, Path(tmp)))


if __name__ == "__main__":
    main()

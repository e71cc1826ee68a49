"""Run under ``accelerate launch`` (or ``torchrun``) with 2 processes: the Trainer, calculator tasks, one GRPO step.

Usage:
  ``ddp_train.py train MODEL_DIR OUTPUT_DIR``   every rank writes ``OUTPUT_DIR/rank<r>.json`` (sha256 of its
      weights before and after, its history) and ``OUTPUT_DIR/rank<r>.pt`` (the transitions it updated on
      and its final weights);
  ``ddp_train.py replay MODEL_DIR OUTPUT_DIR``  one process: GRPO set up the same way, one update on the
      whole batch the ranks shared (their shards re-joined, padding dropped); writes ``replay.json`` and
      ``replay.pt``, to compare with rank 0.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
CALCULATOR = REPO / "examples" / "calculator"
sys.path.insert(0, str(CALCULATOR))

import calculator  # noqa: E402

from spanrl.algorithms import GRPO, LightningRL  # noqa: E402
from spanrl.algorithms.tables import transitions_of  # noqa: E402
from spanrl.algorithms.distributed import rank, world  # noqa: E402
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig  # noqa: E402

LEARNING_RATE = 5e-3
SEED = 0


def weights_sha256(model) -> str:
    digest = hashlib.sha256()
    for name, param in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(param.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def agent(task: dict, llm: LLMEndpoint) -> float:
    """One chat call through the policy server; reward 1 for any text, 0.5 for a tool call, plus a
    task-dependent part so the rewards differ (never all equal: the update moves the weights)."""
    reply = llm.client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8,
        temperature=llm.sampling["temperature"],
    )
    text = reply.choices[0].message.content or ""
    return (0.5 if reply.choices[0].message.tool_calls else 1.0) - 0.05 * len(text.split())


class RecordingGRPO(GRPO):
    """GRPO that keeps the transitions each update saw (this rank's shard)."""

    seen: list = []

    def update(self, batch):
        self.seen.extend(transitions_of(batch))
        return super().update(batch)


def train(model_dir: str, output_dir: str) -> None:
    tasks = calculator.make_tasks(8, seed=3)
    # fp32, unsorted micro-batches: the comparison is to 1e-5; bf16 rounding and the grouping would differ
    algorithm = RecordingGRPO(learning_rate=LEARNING_RATE, bf16=False, length_bucketing=False)
    trainer = Trainer(
        model=model_dir,
        agent=agent,
        tasks=tasks,
        algorithm=algorithm,
        credit=LightningRL(mode="identical", baseline="none", scale_std=False),
        config=TrainerConfig(
            output_dir=str(Path(output_dir) / "run"), n_rollouts=5, tasks_per_step=1, max_steps=1, max_tokens=8,
            eval_at_start=False, progress=False, torch_threads=1, seed=SEED, runner=RunnerConfig(max_concurrency=5),
        ),
    )
    with trainer:
        before = weights_sha256(trainer.algorithm.model)
        history = trainer.train()
        after = weights_sha256(trainer.algorithm.model)
    out = Path(output_dir)
    result = {"rank": rank(), "world": world(), "before": before, "after": after, "history": history}
    (out / f"rank{rank()}.json").write_text(json.dumps(result))
    torch.save({"seen": algorithm.seen, "weights": algorithm.model.state_dict()}, out / f"rank{rank()}.pt")


def replay(model_dir: str, output_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(output_dir)
    shards = [torch.load(out / f"rank{r}.pt", weights_only=False)["seen"] for r in (0, 1)]
    joined = [t for row in zip(*shards) for t in row]  # shard() dealt items r, r+2, ...: deal them back
    batch = [t for t in joined if any(t.completion_mask)]  # drop the inert padding rows
    algorithm = GRPO(learning_rate=LEARNING_RATE, bf16=False, length_bucketing=False)
    algorithm.setup(model_path=Path(model_dir), output_dir=out / "replay", seed=SEED)
    metrics = algorithm.update(batch)
    (out / "replay.json").write_text(
        json.dumps({"metrics": metrics, "rows": len(batch), "padding": len(joined) - len(batch)})
    )
    torch.save({"weights": algorithm.model.state_dict()}, out / "replay.pt")


if __name__ == "__main__":
    {"train": train, "replay": replay}[sys.argv[1]](*sys.argv[2:4])

"""Run under ``accelerate launch --config_file tests/trainer/fsdp_cpu.yaml`` (FSDP2, 2 CPU processes, gloo).

Usage:
  ``fsdp_train.py train MODEL_DIR OUTPUT_DIR``   the Trainer, calculator tasks, one GRPO step; every rank writes
      ``OUTPUT_DIR/rank<r>.json`` (world, the parameter and optimizer-state elements it holds, its history)
      and ``rank<r>.pt`` (the transitions it updated on); rank 0 also writes ``rank0.pt``'s ``weights`` (the
      full weights it gathered) and ``served`` (the embedded policy server's weights after the reload);
  ``fsdp_train.py replay MODEL_DIR OUTPUT_DIR``  one process, no FSDP: one update on the ranks' re-joined
      batch; writes ``replay.json`` (metrics, element counts) and ``replay.pt`` (weights);
  ``fsdp_train.py resume MODEL_DIR OUTPUT_DIR``  (launched like ``train``, after it) resumes from
      ``checkpoint-1`` and takes step 2; rank 0 writes ``resume.pt``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ddp_train  # noqa: E402  (the agent, the tasks and the recording GRPO of the DDP test)

from spanrl.algorithms import GRPO, LightningRL  # noqa: E402
from spanrl.algorithms.distributed import rank, world  # noqa: E402
from spanrl.algorithms.sharding import local_numel, optimizer_state_numel  # noqa: E402
from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig  # noqa: E402


def _counts(algorithm: GRPO) -> dict[str, int]:
    return {"params": local_numel(algorithm.model), "optimizer": optimizer_state_numel(algorithm.trainer.optimizer)}


def _trainer(model_dir: str, output_dir: str, algorithm: GRPO, *, steps: int = 1) -> Trainer:
    return Trainer(
        model=model_dir,
        agent=ddp_train.agent,
        tasks=ddp_train.calculator.make_tasks(8, seed=3),
        algorithm=algorithm,
        credit=LightningRL(mode="identical", baseline="none", scale_std=False),
        config=TrainerConfig(
            output_dir=str(Path(output_dir) / "run"), n_rollouts=5, tasks_per_step=1, max_steps=steps, max_tokens=8,
            eval_at_start=False, progress=False, torch_threads=1, seed=ddp_train.SEED,
            runner=RunnerConfig(max_concurrency=5), resume=steps > 1,
        ),
    )


def train(model_dir: str, output_dir: str) -> None:
    algorithm = ddp_train.RecordingGRPO(learning_rate=ddp_train.LEARNING_RATE, bf16=False, length_bucketing=False)
    trainer = _trainer(model_dir, output_dir, algorithm)
    saved: dict = {"seen": algorithm.seen}
    with trainer:
        history = trainer.train()
        if rank() == 0:
            saved["weights"] = algorithm.policy_weights()
            saved["served"] = trainer.server.embedded._state.batcher.backend.model.state_dict()
    out = Path(output_dir)
    sharded = algorithm.sharding is not None
    result = {"rank": rank(), "world": world(), "sharded": sharded, "history": history, **_counts(algorithm)}
    (out / f"rank{rank()}.json").write_text(json.dumps(result))
    torch.save(saved, out / f"rank{rank()}.pt")


def resume(model_dir: str, output_dir: str) -> None:
    """Every rank resumes from ``checkpoint-1`` (each keeps its shard) and takes step 2; rank 0 writes
    ``resume.pt``: what it gathered right after loading (weights, optimizer state) and the history."""
    algorithm = GRPO(learning_rate=ddp_train.LEARNING_RATE, bf16=False, length_bucketing=False)
    trainer = _trainer(model_dir, output_dir, algorithm, steps=2)
    with trainer:
        assert algorithm.sharding is not None
        loaded = {"weights": algorithm.sharding.weights, "optimizer": algorithm.sharding.optimizer_state}
        history = trainer.train()
    if rank() == 0:
        torch.save({**loaded, "history": history, "after": algorithm.policy_weights()}, Path(output_dir) / "resume.pt")


def replay(model_dir: str, output_dir: str) -> None:
    torch.set_num_threads(1)
    out = Path(output_dir)
    shards = [torch.load(out / f"rank{r}.pt", weights_only=False)["seen"] for r in (0, 1)]
    joined = [t for row in zip(*shards) for t in row]  # shard() dealt items r, r+2, ...: deal them back
    batch = [t for t in joined if any(t.completion_mask)]  # drop the inert padding rows
    algorithm = GRPO(learning_rate=ddp_train.LEARNING_RATE, bf16=False, length_bucketing=False)
    algorithm.setup(model_path=Path(model_dir), output_dir=out / "replay", seed=ddp_train.SEED)
    metrics = algorithm.update(batch)
    result = {"metrics": metrics, "rows": len(batch), "padding": len(joined) - len(batch), **_counts(algorithm)}
    (out / "replay.json").write_text(json.dumps(result))
    torch.save({"weights": algorithm.model.state_dict()}, out / "replay.pt")


if __name__ == "__main__":
    {"train": train, "resume": resume, "replay": replay}[sys.argv[1]](*sys.argv[2:4])

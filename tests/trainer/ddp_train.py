"""Run under ``torchrun --nproc_per_node 2`` (or ``accelerate launch``): the Trainer, calculator tasks, one GRPO step.

Usage: ``ddp_train.py MODEL_DIR OUTPUT_DIR``. Every rank writes ``OUTPUT_DIR/weights-rank<r>.json`` with
a sha256 of its weights before and after training, and the length of the history it returned.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CALCULATOR = REPO / "examples" / "calculator"
sys.path.insert(0, str(CALCULATOR))

import calculator  # noqa: E402

from spanrl.algorithms import GRPO, LightningRL
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig  # noqa: E402
from spanrl.algorithms.distributed import rank, world  # noqa: E402


def weights_sha256(model) -> str:
    digest = hashlib.sha256()
    for name, param in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(param.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def agent(task: dict, llm: LLMEndpoint) -> float:
    """One chat call through the policy server; reward 1 for any text, 0.5 for a tool call (never all zero,
    so the update moves the weights)."""
    reply = llm.client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8,
        temperature=llm.sampling["temperature"],
    )
    return 0.5 if reply.choices[0].message.tool_calls else 1.0


def main(model_dir: str, output_dir: str) -> None:
    tasks = calculator.make_tasks(8, seed=3)
    trainer = Trainer(
        model=model_dir,
        agent=agent,
        tasks=tasks,
        algorithm=GRPO(learning_rate=5e-3),
        credit=LightningRL(mode="identical", baseline="none", scale_std=False),
        config=TrainerConfig(
            output_dir=str(Path(output_dir) / "run"), n_rollouts=3, tasks_per_step=2, max_steps=1, max_tokens=8,
            eval_at_start=False, progress=False, torch_threads=1, runner=RunnerConfig(max_concurrency=6),
        ),
    )
    with trainer:
        before = weights_sha256(trainer.algorithm.model)
        history = trainer.train()
        after = weights_sha256(trainer.algorithm.model)
    out = Path(output_dir) / f"weights-rank{rank()}.json"
    out.write_text(json.dumps({"rank": rank(), "world": world(), "before": before, "after": after, "history": history}))


if __name__ == "__main__":
    main(*sys.argv[1:3])

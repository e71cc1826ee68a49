"""The quick-start API on a small arithmetic environment: an ``AgentEnv``, a ``RewardFunction``, and
the quick-start ``Trainer``.

    python examples/quickstart/arith.py --out runs/quickstart      # tiny model, a few GRPO steps

The policy reads "add 3 4", answers a number; a wrong answer gets "wrong try again" and one more turn.
The reward is 1 for a right first answer, 0.5 for right on the second turn, else 0 (shaping by turn).
Every word the environment writes is in ``VOCAB``, so a word-level tiny model can play it.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spanrl.quickstart import AgentEnv, RewardFunction, Trajectory

MAX_OPERAND = 9
RETRY_TEXT = "wrong try again"
VOCAB = ["add", "sub", *RETRY_TEXT.split(), *(str(n) for n in range(0, 2 * MAX_OPERAND + 1))]


def make_tasks(n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct questions ``add A B`` / ``sub A B`` (A >= B), with answers."""
    rng = random.Random(seed)
    pool = [(op, a, b) for op in ("add", "sub") for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)
            if op == "add" or a >= b]
    rng.shuffle(pool)
    if n > len(pool):
        raise ValueError(f"n must be at most {len(pool)}, got {n!r}")
    return [{"id": f"{op}-{a}-{b}", "question": f"{op} {a} {b}", "answer": str(a + b if op == "add" else a - b)}
            for op, a, b in pool[:n]]


class ArithEnv(AgentEnv):
    """Two turns to answer; the observation after a wrong answer says so."""

    max_turns = 2

    def __init__(self, task: dict[str, Any]) -> None:
        super().__init__(task)
        self.turns = 0
        self.solved = False

    def get_observation(self) -> str:
        return self.task["question"] if self.turns == 0 else RETRY_TEXT

    def step(self, action: str) -> float:
        self.turns += 1
        self.solved = action.strip().split()[:1] == [str(self.task.get("answer"))]
        return 1.0 if self.solved else 0.0

    @property
    def done(self) -> bool:
        return self.solved or self.turns >= self.max_turns

    @classmethod
    def default_tasks(cls) -> list[dict[str, Any]]:
        return make_tasks(64)


class ArithReward(RewardFunction):
    """1 for right on the first turn, 0.5 on the second, else 0."""

    def compute(self, env: ArithEnv, trajectory: Trajectory) -> float:
        if not env.solved:
            return 0.0
        return 1.0 if len(trajectory.turns) == 1 else 0.5


def main(argv: list[str] | None = None) -> int:
    from spanrl.logs import log_to_file

    parser = argparse.ArgumentParser(description="quick-start API demo on a tiny model")
    parser.add_argument("--out", default="runs/quickstart")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"full logs: {log_to_file(Path(args.out) / 'spanrl.log')}")  # the terminal: a bar and a line a step
    from spanrl.demo.tiny import build_tiny_model
    from spanrl.quickstart import Trainer

    model = build_tiny_model(Path(args.out) / "model", words=VOCAB)
    tasks = make_tasks(80)
    trainer = Trainer(model=model, env_class=ArithEnv, reward_class=ArithReward, tasks=tasks[:64], val_tasks=tasks[64:],
                      algorithm="grpo", learning_rate=5e-4, total_steps=args.steps, batch_size=32, n_rollouts=8,
                      max_tokens=2, output_dir=Path(args.out) / "run", progress=True)
    with trainer:
        history = trainer.train()
        print("reward by step:", [round(r.get("reward_mean") or 0.0, 3) for r in history if "reward_mean" in r])
        print("add 3 4 ->", trainer.deploy().run("add 3 4"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU seconds of the demo's SFT warm start update (800 demonstrations x 4 epochs / 32 = 100 optimizer steps on
its tiny Llama, one torch thread), with and without activation checkpointing (``SFTConfig.gradient_checkpointing``;
TRL's own default is on). Synthetic calculator-shaped rows (12 prompt + 6 completion tokens): the update's cost,
not its learning. Prints each setting's process CPU time and whether the weights came out the same.

    .venv/bin/python bench/demo_sft_update.py
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore")

import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from spanrl.algorithms.sft import SFT  # noqa: E402
from spanrl.algorithms.transitions import TRANSITIONS_SCHEMA, Transition, TransitionBatch  # noqa: E402
from spanrl.demo.calculator import tasks as calculator  # noqa: E402
from spanrl.demo.demo import DemoConfig  # noqa: E402
from spanrl.demo.tiny import build_tiny_model  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    cfg = DemoConfig()
    gen = torch.Generator().manual_seed(0)
    rows = [Transition(rollout_id=f"r{i}", task_id="t", attempt=1, agent=None, step=0,
                       prompt_ids=torch.randint(10, 60, (12,), generator=gen).tolist(),
                       completion_ids=torch.randint(10, 60, (6,), generator=gen).tolist(), completion_mask=[1] * 6,
                       old_logprobs=[], reward=1.0, advantage=0.0, policy_version=0, retokenized=False)
             for i in range(cfg.demonstrations)]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model", words=calculator.vocabulary(), seed=0)
        weights = {}
        for ckpt in (True, False):
            algo = SFT(learning_rate=cfg.sft_learning_rate, epochs=cfg.sft_epochs, batch_size=cfg.sft_batch_size,
                       reward_threshold=None, gradient_checkpointing=ckpt)
            algo.setup(model_path=model, output_dir=Path(tmp) / f"run-{ckpt}", seed=0)
            started, wall = time.process_time(), time.perf_counter()
            table = pa.Table.from_pylist([dataclasses.asdict(t) for t in rows], schema=TRANSITIONS_SCHEMA)
            algo.update(TransitionBatch(table, {}, {t.rollout_id: t.reward for t in rows}))
            cpu, wall = time.process_time() - started, time.perf_counter() - wall
            weights[ckpt] = torch.cat([p.detach().flatten() for p in algo.model.parameters()])
            print(f"gradient_checkpointing={ckpt}: {cpu:.2f} CPU-s ({wall:.2f} s wall) for "
                  f"{cfg.demonstrations * cfg.sft_epochs // cfg.sft_batch_size} optimizer steps")
        print("same weights:", torch.equal(weights[True], weights[False]),
              f"(max difference {float((weights[True] - weights[False]).abs().max()):.2e})")


if __name__ == "__main__":
    main()

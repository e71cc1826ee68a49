"""The learned critic (``CreditConfig.critic``) through the Trainer on the tiny model: its figures in every history
row, its head in every checkpoint, and a resumed run goes on from the saved head."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_trainer import _chaos_agent, _config, calculator

from spanrl.algorithms import GRPO, LightningRL
from spanrl.algorithms.checkpoints import VALUE_HEAD_FILE
from spanrl.trainer import Trainer


@pytest.mark.slow
def test_the_head_reports_each_step_and_resumes_from_its_checkpoint(tiny_model: Path, tmp_path: Path) -> None:
    tasks, _ = calculator.split_tasks(40, 4, seed=3)
    out = tmp_path / "run"

    def trainer(max_steps: int, resume: bool) -> Trainer:
        return Trainer(model=tiny_model, agent=_chaos_agent(tmp_path), tasks=tasks, algorithm=GRPO(learning_rate=5e-4),
                       credit=LightningRL(critic={"weight": 1.0}),
                       config=_config(out, max_steps=max_steps, save_every=1, resume=resume))

    first = trainer(2, resume=False).train()
    for row in first:
        assert math.isfinite(row["losses/value_head_loss"]) and row["time/value_head_s"] > 0, row
    assert (out / "checkpoint-2" / VALUE_HEAD_FILE).is_file()

    second = trainer(3, resume=True)
    history = second.train()
    assert [row["step"] for row in history] == [1, 2, 3]
    assert second.algorithm.value_head.steps == 3  # two batches before the checkpoint, one after the resume
    assert (out / "checkpoint-3" / VALUE_HEAD_FILE).is_file()

"""The Trainer's lifecycle and console, without running rollouts: a call that does not fit the state is
refused naming the state, and each step is one readable line."""

from __future__ import annotations

from pathlib import Path

import pytest

from spanrl.algorithms import SFT
from spanrl.errors import TrainingError
from spanrl.trainer.console import step_line
from spanrl.trainer.trainer import State, Trainer


def test_a_new_trainer_refuses_what_needs_a_run(tmp_path: Path) -> None:
    trainer = Trainer(model=tmp_path, agent="python a.py", tasks=[{"id": "a"}], tasks_per_step=1, algorithm=SFT(),
                      output_dir=tmp_path / "run")
    assert trainer.state is State.NEW and trainer.collector is None and trainer.server is None
    with pytest.raises(TrainingError, match=r"cannot save_checkpoint\(\) in state NEW: nothing is set up yet"):
        trainer.save_checkpoint()
    trainer.close()  # safe before start, and twice
    trainer.close()
    assert trainer.state is State.CLOSED
    with pytest.raises(TrainingError, match="nothing to deploy: no checkpoint-<step> folder"):
        trainer.deploy()


def test_step_line_shows_what_a_person_reads() -> None:
    row = {"step": 3, "reward_mean": 0.625, "val_success": 0.8, "losses/approx_kl": 0.00123, "rollouts_ok": 128,
           "rollouts_failed": 0, "time/step_s": 12.34, "transitions_report": {"skipped": 0}, "losses/policy_loss": 0.1}
    assert step_line(row, 30) == "step  3/30  reward 0.62  held-out 0.80  kl 0.0012  rollouts 128  12.3 s"
    assert step_line({"step": 0, "val_success": 0.55}, 30) == "step  0/30  held-out 0.55"
    assert (step_line({"step": 2, "rollouts_ok": 6, "rollouts_failed": 2, "reward_mean": None})
            == "step 2  rollouts 6  failed 2")

"""A real pretrained model learns through the whole pipeline: a shortened examples/smollm2/train.py run
(SmolLM2-135M-Instruct, multiplication whose reply must end with the answer, GRPO, callable agent ->
policy server spans -> DuckDB -> transitions -> update -> reload)."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.smollm2.tasks import exact, lenient, reward, split

STEPS = 5
TASKS_PER_STEP = 8
GROUP = 8
LR = 3e-5
"""3x the example's: the format (stop after the number) has to be found in 5 steps, not 10."""
N_VAL = 50
MARGIN = 0.10
"""Greedy decoding on the same held-out tasks before and after: without a weight change the two scores
are equal, so any rise is learning; 0.10 is 5 of the 50 tasks."""


def test_reward_wants_the_reply_to_end_with_the_answer() -> None:
    assert reward("18", "18") == reward("6 * 3 = 18", "18") == reward("The answer is 18.", "18") == 1.0
    assert reward("6 * 3 = 18\n\nThis is a classic example of", "18") == 0.0  # runs on (or is cut off)
    assert reward("6 * 3 = 81", "18") == reward("", "18") == 0.0
    assert exact("18.", "18") == 1.0 and exact("6 * 3 = 18", "18") == 0.0
    assert lenient("6 * 3 = 18, since", "18") == 1.0


def test_held_out_operands_never_appear_in_training() -> None:
    train, val = split("mul", 100, 100)
    assert len(val) == 100 and len({t["question"] for t in val}) == 100
    assert not {t["key"] for t in train} & {t["key"] for t in val}


@pytest.mark.slow  # 257-301 s here at load 1-2; 23.6 min at load 8-12
# a real 135M model (plus the one-time GGUF conversion on a fresh machine): over the suite's 600 s default
@pytest.mark.timeout(1500)
def test_smollm2_held_out_success_rises(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from examples.smollm2.train import SmolConfig, run

    cfg = SmolConfig(output_dir=str(tmp_path / "run"), steps=STEPS, tasks_per_step=TASKS_PER_STEP, group=GROUP,
                     learning_rate=LR, n_val=N_VAL, eval_every=0, max_minutes=None, threads=1)
    result = run(cfg)
    from training_checks import report_figures

    report_figures("smollm2_multiplication", val_before=result["val_before"], val_after=result["val_after"])
    assert result["steps"] == STEPS and result["rollouts"] == STEPS * TASKS_PER_STEP * GROUP
    assert (tmp_path / "run" / "reward_curve.png").stat().st_size > 0
    # greedy on held-out operand pairs: the same tasks before and after, no sampling noise
    assert result["val_after"] >= result["val_before"] + MARGIN, result

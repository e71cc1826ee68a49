"""The text-to-SQL example trains: on the tiny-vocabulary subset, an SFT warm start on a careless
demonstrator's traces, then GRPO on the execution reward fixes the imitated mistakes (CPU, tiny model)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from examples.text2sql.demonstrator import MISTAKE_SHAPES
from examples.text2sql.sqltools import load_questions
from examples.text2sql.train_tiny import TinyRunConfig, run
from training_checks import report_figures, weights_digest


@pytest.mark.slow
# a limit for a hang, not a speed test: deterministic (one call at a time), at nice 19 beside load 15-34 one
# run took 558 s inside the test and two were stopped at the suite's 600 s (2026-12-07, 8 runs)
@pytest.mark.timeout(1800)
def test_grpo_raises_the_execution_reward_after_a_careless_warm_start(tmp_path):
    result = run(TinyRunConfig(output_dir=str(tmp_path), demos_per_task=4, sft_epochs=25, grpo_steps=6,
                               grpo_tasks_per_step=24, grpo_group_size=6, workers=3, deterministic=True))
    rewards = result["train_reward_by_step"]
    report_figures("text2sql_train", rewards=rewards, val_after_sft=result["val_after_sft"],
                   val_after_grpo=result["val_after_grpo"], demonstrator_reward=result["demonstrator_reward"],
                   mistake_shapes={s: result["train_reward_by_shape"][s]["reward"] for s in MISTAKE_SHAPES},
                   weights=weights_digest(tmp_path / "grpo" / "checkpoint-6"), seconds=result["seconds"])
    assert len(rewards) == 6 and all(r is not None for r in rewards)
    # The demonstrator is right on 3 of 5 shapes and 30% of the time on the other two (expected 0.72).
    assert 0.5 <= result["demonstrator_reward"] <= 0.9
    # Every step samples all 24 training questions, so steps are comparable. The per-shape rewards (SQL over the
    # span store, one entry per policy version: step k's rollouts are version k-1's) add up to the trainer's.
    reward_by_shape = result["train_reward_by_shape"]
    assert set(reward_by_shape) == {q["template"] for q in load_questions("tiny_train")}, reward_by_shape

    def reward_over(shapes: Iterable[str], step: int) -> float:
        """The mean reward of ``shapes``' rollouts at ``step`` (each shape's mean weighted by its rollouts)."""
        pairs = [(reward_by_shape[s]["reward"][step], reward_by_shape[s]["rollouts"][step]) for s in shapes]
        return sum(r * n for r, n in pairs if n) / sum(n for _, n in pairs)

    for step, reward in enumerate(rewards):
        in_store = reward_over(reward_by_shape, step)
        assert abs(in_store - reward) < 1e-9, (step, in_store, rewards, reward_by_shape)

    # GRPO fixes what the warm start imitated: on the demonstrator's two mistake shapes it at least halves the
    # failure rate, and the overall reward rises. Overall the ceiling is ~0.85 (the clean shapes sample noise at
    # temperature 1) and the warm start lands anywhere in 0.63-0.74, so the overall rise depends on where it
    # landed and its bar is low; on the mistake shapes the failure rate is a ratio, whatever the start. Measured
    # over 36 runs (docs/measurements.md, "Text-to-SQL tiny run: the test's spread"): ratio 0.16-0.37, overall
    # rise 0.076-0.23; with GRPO at lr 1e-9, ratio 0.91-0.95 and rise -0.01. Seeded and deterministic, the run
    # is the same at any load: ratio 0.24 and rise 0.205 (0.632 -> 0.837) with bit-identical weights in all
    # 7 runs at load 4-33 ("Learning tests over repeated runs"). The bounds stay below the worst of the 36
    # unpinned runs (by 0.13 and 0.046): another host or torch version samples other tokens from the same seed.
    before = reward_over(MISTAKE_SHAPES, 0)
    after = (reward_over(MISTAKE_SHAPES, -1) + reward_over(MISTAKE_SHAPES, -2)) / 2
    assert 1 - after <= 0.5 * (1 - before), (before, after, reward_by_shape)
    assert (rewards[-1] + rewards[-2]) / 2 >= rewards[0] + 0.03, rewards
    # Held-out, greedy (6 questions): the warm start answers the clean shapes' questions (3 of 6), and GRPO on
    # the training questions does not lose any of them. `>=` alone passes when GRPO changed nothing, so: the
    # GRPO checkpoint's weights differ from the warm start's, and the figure is the greedy evaluation of the
    # last step recomputed from the span store.
    from training_checks import max_weight_change, val_success_in_store

    assert result["val_after_sft"] >= 0.5, result
    assert result["val_after_grpo"] >= result["val_after_sft"], result
    assert max_weight_change(tmp_path / "sft" / "checkpoint-1", tmp_path / "grpo" / "checkpoint-6") > 0
    assert result["val_after_grpo"] == val_success_in_store(tmp_path / "spans.duckdb", 6, result["n_val"])

"""The text-to-SQL example trains: on the tiny-vocabulary subset, an SFT warm start on a careless
demonstrator's traces, then GRPO on the execution reward fixes the imitated mistakes (CPU, tiny model)."""

from __future__ import annotations

from collections import Counter

import pytest

from examples.text2sql.demonstrator import MISTAKE_SHAPES
from examples.text2sql.sqltools import load_questions
from examples.text2sql.train_tiny import TinyRunConfig, run


@pytest.mark.slow
def test_grpo_raises_the_execution_reward_after_a_careless_warm_start(tmp_path):
    result = run(TinyRunConfig(output_dir=str(tmp_path), demos_per_task=4, sft_epochs=25, grpo_steps=6,
                               grpo_tasks_per_step=24, grpo_group_size=6, workers=3))
    rewards = result["train_reward_by_step"]
    assert len(rewards) == 6 and all(r is not None for r in rewards)
    # The demonstrator is right on 3 of 5 shapes and 30% of the time on the other two (expected 0.72).
    assert 0.5 <= result["demonstrator_reward"] <= 0.9
    # Every step samples all 24 training questions, so steps are comparable. The per-shape rewards (SQL over the
    # span store) add up to the trainer's per-step reward.
    shapes = result["train_reward_by_shape"]
    sizes = Counter(q["template"] for q in load_questions("tiny_train"))
    assert set(shapes) == set(sizes) and all(len(by_step) == 6 for by_step in shapes.values()), shapes
    for step, reward in enumerate(rewards):
        assert abs(sum(n * shapes[s][step] for s, n in sizes.items()) / sum(sizes.values()) - reward) < 1e-9

    def mistake_shapes(step: int) -> float:
        return sum(sizes[s] * shapes[s][step] for s in MISTAKE_SHAPES) / sum(sizes[s] for s in MISTAKE_SHAPES)

    # GRPO fixes what the warm start imitated: on the demonstrator's two mistake shapes it at least halves the
    # failure rate, and the overall reward rises. Overall the ceiling is ~0.85 (the clean shapes sample noise at
    # temperature 1) and the warm start lands anywhere in 0.62-0.74, so the overall rise depends on where it
    # landed and the bar is low; on the mistake shapes the failure rate is a ratio, whatever the start.
    # Measured, 36 runs (docs/measurements.md, "Text-to-SQL tiny run"): ratio 0.16-0.37, overall rise 0.08-0.23.
    before, after = mistake_shapes(0), (mistake_shapes(-1) + mistake_shapes(-2)) / 2
    assert 1 - after <= 0.5 * (1 - before), (before, after, shapes)
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

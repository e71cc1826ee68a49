"""Credit assignment's ``running`` baseline (algorithms/baseline.py): each rollout's episode reward
against the running statistics of earlier batches, by the formulas of that module's docstring."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spanrl.algorithms.baseline import RunningBaseline
from spanrl.algorithms.credit import CreditConfig, assign_credit
from spanrl.errors import ConfigError


def _one_call_each(config, rewards, groups, running, *, calls_per_rollout=1):
    """assign_credit over rollouts of ``calls_per_rollout`` calls each, one final reward each."""
    n = len(rewards)
    call_rollout = np.repeat(np.arange(n), calls_per_rollout)
    call_step = np.tile(np.arange(calls_per_rollout), n)
    return assign_credit(
        config, call_rollout=call_rollout, call_step=call_step, rollout_calls=np.full(n, calls_per_rollout),
        rollout_group=np.array(groups), reward_rollout=np.arange(n), reward_step=np.full(n, calls_per_rollout - 1),
        reward_value=np.array(rewards, dtype=float), reward_time_ns=np.zeros(n, dtype=np.int64), running=running,
    )


def test_running_baseline_is_the_formula_and_carries_over_batches():
    config = CreditConfig(mode="identical", baseline="running", scale_std=True)
    state = RunningBaseline(window=20, prior=2.0, clip_std=4.0)
    first = _one_call_each(config, [1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], (state, ["easy", "hard"]))
    # nothing seen: m = 0.5 and sigma ** 2 = 1/3 from the batch (ddof 1), b = m for every task
    sigma = math.sqrt(1 / 3)
    assert first.advantages == pytest.approx([0.5 / sigma, -0.5 / sigma, 0.5 / sigma, -0.5 / sigma])
    assert state.count == 4 and state.tasks["easy"] == [2, 0.5] and state.tasks["hard"] == [2, 0.5]
    m, var = state.mean, state.var
    # second batch, two calls per rollout: every call of a rollout gets its rollout's A
    second = _one_call_each(config, [1.0], [0], (state, ["easy"]), calls_per_rollout=2)
    b = (2 * 0.5 + 2.0 * m) / (2 + 2.0)
    assert second.advantages == pytest.approx([(1.0 - b) / math.sqrt(var)] * 2)
    assert state.count == 5 and state.tasks["easy"][0] == 3


def test_running_without_scaling_and_unseen_task():
    config = CreditConfig(mode="identical", baseline="running", scale_std=False)
    state = RunningBaseline(window=20, prior=2.0, mean=0.25, var=0.04, count=10, tasks={"seen": [4, 1.0]})
    out = _one_call_each(config, [1.0, 1.0, 0.5], [0, 1, 2], (state, ["seen", "new", None]))
    assert out.advantages == pytest.approx([1.0 - (4 * 1.0 + 2.0 * 0.25) / 6, 1.0 - 0.25, 0.5 - 0.25])


def test_an_outlier_is_winsorized_before_it_counts():
    config = CreditConfig(mode="identical", baseline="running", scale_std=False)
    state = RunningBaseline(window=20, prior=2.0, clip_std=4.0, mean=0.5, var=0.25, count=20)
    out = _one_call_each(config, [1e30], [0], (state, ["t"]))
    assert out.advantages == pytest.approx([4.0 - 0.0])  # clipped to m + 4 * max(0.5, 1) = 4.5, b = m = 0.5
    assert state.mean == pytest.approx(0.5 + (4.5 - 0.5) / 20)


def test_a_rollout_without_reward_gets_nan_and_is_not_observed():
    config = CreditConfig(mode="identical", baseline="running", scale_std=False, missing_reward="skip")
    state = RunningBaseline(mean=0.0, var=1.0, count=5)
    result = assign_credit(
        config, call_rollout=np.array([0, 1]), call_step=np.array([0, 0]), rollout_calls=np.array([1, 1]),
        rollout_group=np.array([0, 0]), reward_rollout=np.array([0]), reward_step=np.array([0]),
        reward_value=np.array([1.0]), reward_time_ns=np.array([0]), running=(state, ["t"]),
    )
    assert result.advantages[0] == pytest.approx(1.0) and math.isnan(result.advantages[1])
    assert state.count == 6


def test_running_needs_its_state_and_the_identical_mode():
    with pytest.raises(ConfigError, match="baseline 'running' compares with earlier batches: pass running="):
        _one_call_each(CreditConfig(baseline="running"), [1.0], [0], None)
    with pytest.raises(ConfigError, match="baseline 'running' takes mode 'identical'.*got mode 'step'"):
        _one_call_each(CreditConfig(mode="step", baseline="running"), [1.0], [0], (RunningBaseline(), ["t"]))
    with pytest.raises(ConfigError, match="baseline must be 'none' when mode is 'gae'"):
        CreditConfig(mode="gae", baseline="running").validate()
    with pytest.raises(ConfigError, match="baseline must be one of grpo, rloo, none, running; got 'mean'"):
        CreditConfig(baseline="mean").validate()  # type: ignore[arg-type]


def test_one_extreme_reward_per_batch_cannot_drown_the_honest_gap():
    """Issue 53, finding 4: one legal 1e6 reward in every batch of 8 widened the winsorizing band with sigma, which
    grew each batch, until the advantage gap between an honest 1 and an honest 0 fell from 0.43 to 0.0001 in 40
    batches. Around the median and MAD of the recent rewards the band holds, and so does the gap (0.61)."""
    poisoned, clean = RunningBaseline(), RunningBaseline()
    gaps = []
    for _ in range(40):
        got = poisoned.advantages([("t", 1.0), ("t", 0.0)] * 3 + [("t", 1.0), ("t", 1e6)], scale_std=True)
        gaps.append(got[0] - got[1])
        honest = clean.advantages([("t", 1.0), ("t", 0.0)] * 4, scale_std=True)
    assert gaps[0] == pytest.approx(0.434, abs=1e-3) and min(gaps) > 0.29 and gaps[-1] == pytest.approx(0.610, abs=1e-3)
    assert honest[0] - honest[1] == pytest.approx(2.0, abs=1e-2)
    assert math.sqrt(poisoned.var) < 2.5 and poisoned.finite()
    # a real shift of the reward scale is still followed once it fills half of the window
    for _ in range(3):
        poisoned.advantages([("t", 100.0)] * 8, scale_std=True)
    assert poisoned.winsorize(100.0) == 100.0 and poisoned.mean > 50

"""CreditConfig validation and assign_credit on small arrays worked out by hand.

The end-to-end versions (span trees through the collector) are in test_transitions.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from spanrl.algorithms.credit import CreditConfig, assign_credit, default_config
from spanrl.errors import ConfigError


def credit(config: CreditConfig, *, calls: list[tuple[int, int]], n_calls: list[int], groups: list[int],
           rewards: list[tuple[int, int, float]], names: list[str] | None = None, values: list[float] | None = None):
    """calls: (rollout, step); rewards: (rollout, step, value), in time order."""
    return assign_credit(
        config,
        call_rollout=np.array([c[0] for c in calls]),
        call_step=np.array([c[1] for c in calls]),
        rollout_calls=np.array(n_calls),
        rollout_group=np.array(groups),
        reward_rollout=np.array([r[0] for r in rewards], dtype=np.int64),
        reward_step=np.array([r[1] for r in rewards], dtype=np.int64),
        reward_value=np.array([r[2] for r in rewards], dtype=np.float64),
        reward_time_ns=np.arange(len(rewards)),
        reward_name=np.array(names, dtype=object) if names is not None else None,
        values=np.array(values) if values is not None else None,
    )


def test_default_config_validates_and_is_a_new_object() -> None:
    a, b = default_config(), default_config()
    a.validate()
    assert a is not b and (a.mode, a.baseline, a.scale_std, a.per_rollout) == ("identical", "grpo", True, True)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "final"}, "mode must be one of identical, discounted, step, gae; got 'final'"),
        ({"baseline": "ppo"}, "baseline must be one of grpo, rloo, none; got 'ppo'"),
        ({"gamma": 1.5}, r"gamma must be a number in \[0, 1\], got 1.5"),
        ({"lam": -0.1}, r"lam must be a number in \[0, 1\], got -0.1"),
        ({"mode": "gae"}, "baseline must be 'none' when mode is 'gae' \\(the critic is the baseline\\), got 'grpo'"),
        ({"missing_reward": "drop"}, "missing_reward must be 'skip' or 'zero', got 'drop'"),
        ({"nan_reward": None}, "nan_reward must be 'skip' or 'zero', got None"),
        ({"eps": 0}, "eps must be a positive number, got 0"),
        ({"reward_name": 3}, "reward_name must be a string or None, got 3"),
        ({"trajectory_aggregation": "yes"}, "trajectory_aggregation must be a boolean, got 'yes'"),
    ],
)
def test_bad_config_fails_with_its_message(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}$"):
        CreditConfig(**fields).validate()


def test_identical_uses_the_last_reward_by_time() -> None:
    res = credit(CreditConfig(baseline="none", scale_std=False), calls=[(0, 0), (0, 1)], n_calls=[2], groups=[0],
                 rewards=[(0, 1, 0.9), (0, 0, 0.2)])  # the second in time order wins, whatever its step
    assert res.advantages.tolist() == [0.2, 0.2] and res.episode_reward.tolist() == [0.2]


def test_reward_name_selects_one_reward_dimension() -> None:
    res = credit(CreditConfig(baseline="none", scale_std=False, reward_name="accuracy"), calls=[(0, 0)], n_calls=[1],
                 groups=[0], rewards=[(0, 0, 0.7), (0, 0, 0.1)], names=["accuracy", "length"])
    assert res.advantages.tolist() == [0.7]


def test_grpo_singleton_group_is_not_divided_by_a_zero_std() -> None:
    # one rollout in its task: at each step the baseline is its own return-to-go, std undefined -> 0, unscaled
    res = credit(CreditConfig(mode="step"), calls=[(0, 0), (0, 1)], n_calls=[2], groups=[0],
                 rewards=[(0, 0, 0.5), (0, 1, 1.0)])
    assert res.advantages.tolist() == [0.0, 0.0]
    assert res.report["singleton_groups"] == 1 and res.report["unscaled_groups"] == 1


def test_none_baseline_with_scale_std_whitens_the_batch() -> None:
    res = credit(CreditConfig(baseline="none"), calls=[(0, 0), (1, 0), (2, 0)], n_calls=[1, 1, 1], groups=[0, 1, 2],
                 rewards=[(0, 0, 1.0), (1, 0, 2.0), (2, 0, 3.0)])
    assert res.advantages == pytest.approx([-1.0, 0.0, 1.0], rel=1e-5)  # mean 2, std 1


def test_calls_of_skipped_rollouts_get_nan_and_do_not_enter_group_statistics() -> None:
    res = credit(CreditConfig(scale_std=False), calls=[(0, 0), (1, 0), (2, 0)], n_calls=[1, 1, 1], groups=[0, 0, 0],
                 rewards=[(0, 0, 1.0), (2, 0, math.nan)])
    assert res.keep.tolist() == [True, False, False]
    assert res.advantages[0] == 0.0 and np.isnan(res.advantages[1:]).all()
    assert res.report == {**res.report, "skipped_no_reward": 1, "nan_reward": 1, "skipped_nan_reward": 1}


def test_gae_needs_values_for_every_call() -> None:
    with pytest.raises(ConfigError, match=r"values must have one entry per call \(2\), got shape \(1,\)"):
        credit(CreditConfig(mode="gae", baseline="none"), calls=[(0, 0), (0, 1)], n_calls=[2], groups=[0],
               rewards=[(0, 1, 1.0)], values=[0.1])

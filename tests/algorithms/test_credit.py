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
        ({"baseline": "ppo"}, "baseline must be one of grpo, rloo, none, running; got 'ppo'"),
        ({"gamma": 1.5}, r"gamma must be a number in \[0, 1\], got 1.5"),
        ({"lam": -0.1}, r"lam must be a number in \[0, 1\], got -0.1"),
        ({"mode": "gae"}, "baseline must be 'none' when mode is 'gae' \\(the critic is the baseline\\), got 'grpo'"),
        ({"missing_reward": "drop"}, "missing_reward must be 'skip' or 'zero', got 'drop'"),
        ({"nan_reward": None}, "nan_reward must be 'skip', 'zero' or 'ignore', got None"),
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


# --- worked by hand, each aimed at a mutant `make mutation` found surviving (tests/mutation/run.py) ------
ONE_CALL_EACH = dict(calls=[(0, 0), (1, 0), (2, 0), (3, 0)], n_calls=[1, 1, 1, 1], groups=[0, 0, 0, 1],
                     rewards=[(0, 0, 1.0), (1, 0, 0.0), (2, 0, 2.0), (3, 0, 5.0)])


def test_grpo_and_rloo_baselines_over_rollouts() -> None:
    grpo = credit(CreditConfig(scale_std=False), **ONE_CALL_EACH)
    assert grpo.advantages.tolist() == [0.0, -1.0, 1.0, 0.0]  # group 0 mean 1; group 1 alone: its own mean
    rloo = credit(CreditConfig(baseline="rloo", scale_std=False), **ONE_CALL_EACH)
    # the others' mean: (0+2)/2, (1+2)/2, (1+0)/2; a rollout alone in its group is its own baseline
    assert rloo.advantages.tolist() == [0.0, -1.5, 1.5, 0.0]
    assert grpo.report["singleton_groups"] == rloo.report["singleton_groups"] == 1


def test_std_scaling_divides_by_std_plus_eps_only_from_eps_up() -> None:
    # group 0's std (ddof 1) is exactly 1.0: with eps = 1.0 it is scaled, by 1 / (1 + 1)
    res = credit(CreditConfig(eps=1.0), **ONE_CALL_EACH)
    assert res.advantages.tolist() == [0.0, -0.5, 0.5, 0.0]
    assert res.report["unscaled_groups"] == 1  # group 1: one rollout, std undefined
    assert credit(CreditConfig(eps=1.5), **ONE_CALL_EACH).advantages.tolist() == [0.0, -1.0, 1.0, 0.0]


def test_per_call_statistics_grpo_and_rloo() -> None:
    kw = dict(calls=[(0, 0), (0, 1), (1, 0)], n_calls=[2, 1], groups=[0, 0], rewards=[(0, 1, 1.0), (1, 0, 4.0)])
    grpo = credit(CreditConfig(per_rollout=False, scale_std=False), **kw)
    assert grpo.advantages.tolist() == [-1.0, -1.0, 2.0]  # mean over the calls (1, 1, 4) = 2
    rloo = credit(CreditConfig(per_rollout=False, baseline="rloo", scale_std=False), **kw)
    # rollout 0's calls against rollout 1's one call (4); rollout 1 against rollout 0's two (1, 1)
    assert rloo.advantages.tolist() == [-3.0, -3.0, 3.0]
    assert rloo.report["singleton_groups"] == 0
    alone = credit(CreditConfig(per_rollout=False, baseline="rloo", scale_std=False), calls=[(0, 0), (0, 1)],
                   n_calls=[2], groups=[0], rewards=[(0, 1, 3.0)])
    assert alone.advantages.tolist() == [0.0, 0.0] and alone.report["singleton_groups"] == 1


def test_discounted_mode_scales_by_gamma_to_the_calls_that_followed() -> None:
    kw = dict(calls=[(0, 0), (0, 1), (0, 2)], n_calls=[3], groups=[0], rewards=[(0, 2, 1.0)])
    res = credit(CreditConfig(mode="discounted", gamma=0.5, baseline="none", scale_std=False), **kw)
    assert res.returns.tolist() == [0.25, 0.5, 1.0] and res.advantages.tolist() == [0.25, 0.5, 1.0]
    two = credit(CreditConfig(mode="discounted", gamma=0.5, scale_std=False), calls=[(0, 0), (0, 1), (1, 0), (1, 1)],
                 n_calls=[2, 2], groups=[0, 0], rewards=[(0, 1, 1.0), (1, 1, 3.0)])
    assert two.advantages.tolist() == [-0.5, -1.0, 0.5, 1.0]  # (G - 2) * 0.5 ** (1 - t)


SUM = dict(episode_reward="sum")  # every reward counts (the default, "last", keeps only the last by time)
STEP_KW = dict(calls=[(0, 0), (0, 1), (1, 0)], n_calls=[2, 1], groups=[0, 0],
               rewards=[(0, 0, 1.0), (0, 1, 2.0), (1, 0, 4.0)])


def test_step_mode_returns_to_go_reset_at_each_rollout() -> None:
    # dense rewards [1, 2 | 4]; gamma 0.5: rollout 0 -> [1 + 0.5 * 2, 2], rollout 1 -> [4] (nothing carried over)
    res = credit(CreditConfig(mode="step", gamma=0.5, baseline="none", scale_std=False, **SUM), **STEP_KW)
    assert res.returns.tolist() == [2.0, 2.0, 4.0]


def test_step_mode_baselines_compare_rollouts_at_the_same_step() -> None:
    # returns-to-go grid (gamma 1): rollout 0 [3, 2], rollout 1 [4] (it never reached step 1)
    grpo = credit(CreditConfig(mode="step", scale_std=False, **SUM), **STEP_KW)
    assert grpo.advantages.tolist() == [-0.5, 0.0, 0.5]  # step 0 mean 3.5; step 1: rollout 0 alone: 0
    rloo = credit(CreditConfig(mode="step", baseline="rloo", scale_std=False, **SUM), **STEP_KW)
    assert rloo.advantages.tolist() == [-1.0, 0.0, 1.0]  # the other rollout's value at step 0; none at step 1
    assert rloo.report["singleton_groups"] == 0 and rloo.report["rewards_before_first_call"] == 0


def test_step_mode_counts_unscaled_groups_only_at_steps_they_reached() -> None:
    # group 1: two one-call rollouts (std 1 at step 0); its step 1 (std 0) is past both their ends, so it
    # is not an unscaled group; group 0 (one rollout) is
    res = credit(CreditConfig(mode="step"), calls=[(0, 0), (0, 1), (1, 0), (2, 0)], n_calls=[2, 1, 1], groups=[0, 1, 1],
                 rewards=[(0, 1, 1.0), (1, 0, 1.0), (2, 0, 1.0 + math.sqrt(2))])
    assert res.report["unscaled_groups"] == 1
    assert res.advantages[2:] == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], rel=1e-5)


def test_rewards_before_the_first_call_are_counted_in_step_and_gae_modes_only() -> None:
    kw = dict(calls=[(0, 0)], n_calls=[1], groups=[0], rewards=[(0, -1, 0.5), (0, 0, 1.0)])
    assert credit(CreditConfig(mode="step", **SUM), **kw).report["rewards_before_first_call"] == 1
    assert credit(CreditConfig(mode="step"), **kw).report["rewards_before_first_call"] == 0  # "last" dropped it
    assert "rewards_before_first_call" not in credit(CreditConfig(), **kw).report


def test_gae_by_hand() -> None:
    # rollout 0: rewards 0.5 at step 0 and 1.0 at step 1, values (0.5, 0.2); rollout 1: reward 2 at step 0, value 1
    res = credit(CreditConfig(mode="gae", baseline="none", scale_std=False, gamma=0.9, lam=0.5, **SUM),
                 calls=[(0, 0), (0, 1), (1, 0)], n_calls=[2, 1], groups=[0, 1],
                 rewards=[(0, 0, 0.5), (0, 1, 1.0), (1, 0, 2.0)], values=[0.5, 0.2, 1.0])
    # step 1: delta = 1.0 - 0.2 = 0.8; step 0: delta = 0.5 + 0.9 * 0.2 - 0.5 = 0.18, A = 0.18 + 0.9 * 0.5 * 0.8
    assert res.advantages == pytest.approx([0.54, 0.8, 1.0], abs=1e-12)
    assert res.returns == pytest.approx([1.04, 1.0, 2.0], abs=1e-12)


def test_whitening_equal_advantages_only_centres_them() -> None:
    res = credit(CreditConfig(baseline="none"), calls=[(0, 0), (1, 0)], n_calls=[1, 1], groups=[0, 1],
                 rewards=[(0, 0, 2.0), (1, 0, 2.0)])
    assert res.advantages.tolist() == [0.0, 0.0]  # std 0 < eps: not divided, still centred


def test_lightningrl_validates_its_config() -> None:
    from spanrl.algorithms.credit import LightningRL

    with pytest.raises(ConfigError, match="baseline must be one of grpo, rloo, none, running; got 'ppo'"):
        LightningRL(baseline="ppo")
    with pytest.raises(ConfigError, match="LightningRL got an unknown field"):
        LightningRL(gama=0.9)
    assert LightningRL(mode="step", gamma=0.5) == CreditConfig(mode="step", gamma=0.5)


def test_config_edges_gamma_zero_is_allowed_a_bool_is_not() -> None:
    CreditConfig(gamma=0.0, lam=0.0).validate()
    with pytest.raises(ConfigError, match="^gamma must be a number in \\[0, 1\\], got True$"):
        CreditConfig(gamma=True).validate()
    assert CreditConfig().trajectory_aggregation is False


def test_missing_reward_zero_scores_the_rollout_zero() -> None:
    res = credit(CreditConfig(missing_reward="zero", scale_std=False), calls=[(0, 0), (1, 0)], n_calls=[1, 1],
                 groups=[0, 0], rewards=[(0, 0, 2.0)])
    assert res.advantages.tolist() == [1.0, -1.0] and res.report["defaulted_no_reward"] == 1


def test_no_rewards_at_all_skips_every_rollout() -> None:
    res = credit(CreditConfig(), calls=[(0, 0), (1, 0)], n_calls=[1, 1], groups=[0, 0], rewards=[])
    assert res.keep.tolist() == [False, False] and np.isnan(res.advantages).all()


def test_the_last_reward_by_time_is_found_per_rollout_when_interleaved() -> None:
    res = credit(CreditConfig(baseline="none", scale_std=False), calls=[(0, 0), (1, 0)], n_calls=[1, 1], groups=[0, 1],
                 rewards=[(0, 0, 1.0), (1, 0, 5.0), (0, 0, 3.0)])
    assert res.episode_reward.tolist() == [3.0, 5.0]


def test_step_mode_drops_a_reward_before_the_first_call_from_the_returns() -> None:
    res = credit(CreditConfig(mode="step", baseline="none", scale_std=False), calls=[(0, 0)], n_calls=[1], groups=[0],
                 rewards=[(0, -1, 0.5), (0, 0, 1.0)])
    assert res.returns.tolist() == [1.0]


def test_groups_without_kept_rollouts_are_not_counted_unscaled() -> None:
    # group 1 has no rollout at all; group 2's only rollout is skipped (no reward)
    kw = dict(calls=[(0, 0), (1, 0), (2, 0)], n_calls=[1, 1, 1], groups=[0, 0, 2], rewards=[(0, 0, 1.0), (1, 0, 2.0)])
    assert credit(CreditConfig(), **kw).report["unscaled_groups"] == 0
    assert credit(CreditConfig(mode="step"), **kw).report["unscaled_groups"] == 0


def test_every_reward_counts_when_no_reward_name_is_chosen() -> None:
    res = credit(CreditConfig(baseline="none", scale_std=False), calls=[(0, 0)], n_calls=[1], groups=[0],
                 rewards=[(0, 0, 0.7), (0, 0, 0.1)], names=["accuracy", "length"])
    assert res.advantages.tolist() == [0.1]  # the last by time, whatever its name


def test_nan_reward_zero_counts_it_as_zero() -> None:
    res = credit(CreditConfig(nan_reward="zero", scale_std=False), calls=[(0, 0), (1, 0)], n_calls=[1, 1],
                 groups=[0, 0], rewards=[(0, 0, math.nan), (1, 0, 2.0)])
    assert res.keep.tolist() == [True, True] and res.advantages.tolist() == [-1.0, 1.0]


def test_an_empty_batch_gives_empty_results() -> None:
    for mode in ("identical", "step"):
        res = credit(CreditConfig(mode=mode), calls=[], n_calls=[], groups=[], rewards=[])
        assert res.advantages.shape == (0,) and res.keep.shape == (0,)


def test_rloo_over_pairs_and_the_singleton_count() -> None:
    # groups of 2, 2 and 1: each of a pair is compared with the other; the singleton with itself
    res = credit(CreditConfig(baseline="rloo", scale_std=False), calls=[(i, 0) for i in range(5)], n_calls=[1] * 5,
                 groups=[0, 0, 1, 1, 2], rewards=[(0, 0, 1.0), (1, 0, 3.0), (2, 0, 0.0), (3, 0, 0.5), (4, 0, 9.0)])
    assert res.advantages.tolist() == [-2.0, 2.0, -0.5, 0.5, 0.0] and res.report["singleton_groups"] == 1


def test_grpo_over_calls_of_a_rollout_alone_in_its_group() -> None:
    res = credit(CreditConfig(per_rollout=False, scale_std=False), calls=[(0, 0), (0, 1)], n_calls=[2], groups=[0],
                 rewards=[(0, 1, 3.0)])
    assert res.advantages.tolist() == [0.0, 0.0]
    one_call = credit(CreditConfig(per_rollout=False, scale_std=False), calls=[(0, 0)], n_calls=[1], groups=[0],
                      rewards=[(0, 0, 3.0)])
    assert one_call.advantages.tolist() == [0.0]  # a group of one call: its own mean


def test_step_mode_rloo_for_a_rollout_alone_in_its_group() -> None:
    res = credit(CreditConfig(mode="step", baseline="rloo", scale_std=False), calls=[(0, 0), (0, 1)], n_calls=[2],
                 groups=[0], rewards=[(0, 1, 3.0)])
    assert res.advantages.tolist() == [0.0, 0.0]


def test_step_mode_scales_by_std_plus_eps_from_eps_up() -> None:
    # step 0 of group 0: returns-to-go 1 and 1 + 2 sqrt(2): std 2; eps 1 -> divided by 3
    kw = dict(calls=[(0, 0), (1, 0)], n_calls=[1, 1], groups=[0, 0],
              rewards=[(0, 0, 1.0), (1, 0, 1.0 + 2 * math.sqrt(2))])
    res = credit(CreditConfig(mode="step", eps=1.0), **kw)
    assert res.advantages == pytest.approx([-math.sqrt(2) / 3, math.sqrt(2) / 3], rel=1e-9)
    # std exactly eps (rewards 0 and 2: std sqrt(2); eps sqrt(2)) is still divided, and no group is unscaled
    at_eps = credit(CreditConfig(mode="step", eps=math.sqrt(2)), calls=kw["calls"], n_calls=[1, 1], groups=[0, 0],
                    rewards=[(0, 0, 0.0), (1, 0, 2.0)])
    assert at_eps.advantages == pytest.approx([-1 / (2 * math.sqrt(2)), 1 / (2 * math.sqrt(2))], rel=1e-9)
    assert at_eps.report["unscaled_groups"] == 0


def test_whitening_divides_by_std_plus_eps_from_eps_up_and_leaves_one_value_alone() -> None:
    kw = dict(calls=[(0, 0), (1, 0), (2, 0)], n_calls=[1, 1, 1], groups=[0, 1, 2],
              rewards=[(0, 0, 0.0), (1, 0, 2.0), (2, 0, 4.0)])  # mean 2, std 2
    assert (credit(CreditConfig(baseline="none", eps=1.0), **kw).advantages.tolist()
            == pytest.approx([-2 / 3, 0.0, 2 / 3]))
    assert credit(CreditConfig(baseline="none", eps=2.0), **kw).advantages.tolist() == [-0.5, 0.0, 0.5]  # std == eps
    one = credit(CreditConfig(baseline="none"), calls=[(0, 0)], n_calls=[1], groups=[0], rewards=[(0, 0, 2.0)])
    assert one.advantages.tolist() == [2.0]  # a batch of one is not whitened

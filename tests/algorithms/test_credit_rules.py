"""Issue 52's rules for every mode, on arrays worked out by hand: identical rewards give zero advantage at
unequal lengths, one episode-reward rule (``episode_reward``), and aggregation refused only where it would
lose per-call credit (gae)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from test_credit import credit

from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.transitions import load_transitions
from spanrl.errors import ConfigError

# rollouts of 2, 2 and 3 calls of one task, each rewarded 1 after its last call
UNEQUAL = dict(calls=[(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)], n_calls=[2, 2, 3], groups=[0, 0, 0],
               rewards=[(0, 1, 1.0), (1, 1, 1.0), (2, 2, 1.0)])


@pytest.mark.parametrize("baseline", ["grpo", "rloo"])
@pytest.mark.parametrize("per_rollout", [True, False])
@pytest.mark.parametrize("mode", [dict(mode="identical"), dict(mode="discounted", gamma=0.9),
                                  dict(mode="step"), dict(mode="identical", step_group_weight=1.0)])
def test_identical_rewards_give_zero_at_unequal_lengths(mode: dict, baseline: str, per_rollout: bool) -> None:
    config = CreditConfig(baseline=baseline, per_rollout=per_rollout, **mode)
    states = [0, 1] * 2 + [0, 1, 2]  # GiGPO: the states at each step alike
    res = assign_with_states(config, states) if config.step_group_weight else credit(config, **UNEQUAL)
    assert res.advantages.tolist() == [0.0] * 7  # the third call (step 2, reached by one rollout) too


def assign_with_states(config: CreditConfig, states: list[int]) -> Any:
    from spanrl.algorithms.credit import assign_credit

    kw = UNEQUAL
    return assign_credit(
        config, call_rollout=np.array([c[0] for c in kw["calls"]]), call_step=np.array([c[1] for c in kw["calls"]]),
        rollout_calls=np.array(kw["n_calls"]), rollout_group=np.array(kw["groups"]),
        reward_rollout=np.array([r[0] for r in kw["rewards"]]), reward_step=np.array([r[1] for r in kw["rewards"]]),
        reward_value=np.array([r[2] for r in kw["rewards"]]), reward_time_ns=np.arange(3), call_state=np.array(states))


def test_step_mode_with_a_discount_prefers_the_shorter_way_to_the_same_reward() -> None:
    # gamma < 1: the same reward one call later is worth less, so 2, 2, 3 calls rewarded 1 are not alike:
    # returns-to-go [0.9, 1], [0.9, 1], [0.81, 0.9, 1]; rloo step 0: 0.9 - 0.855, 0.81 - 0.9; step 1: 1 - 0.95, 0.9 - 1
    res = credit(CreditConfig(mode="step", gamma=0.9, baseline="rloo", scale_std=False), **UNEQUAL)
    assert res.advantages == pytest.approx([0.045, 0.05, 0.045, 0.05, -0.09, -0.1, 0.0], abs=1e-12)


# rollouts of 1, 2 and 3 calls with final rewards 1, 0, 2 after their last call; gamma 0.5:
# returns-to-go A [1], B [0, 0], C [0.5, 1, 2]
STEPS = dict(calls=[(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)], n_calls=[1, 2, 3], groups=[0, 0, 0],
             rewards=[(0, 0, 1.0), (1, 1, 0.0), (2, 2, 2.0)])


def test_step_mode_compares_each_step_with_the_rollouts_that_reached_it() -> None:
    grpo = credit(CreditConfig(mode="step", gamma=0.5), **STEPS)
    # step 0: [1, 0, 0.5], mean 0.5, std 0.5 -> [1, -1, 0]; step 1: [0, 1], mean 0.5, std sqrt(0.5);
    # step 2: C alone -> 0
    s1 = 0.5 / math.sqrt(0.5)
    assert grpo.advantages == pytest.approx([1.0, -1.0, -s1, 0.0, s1, 0.0], rel=1e-5)
    rloo = credit(CreditConfig(mode="step", gamma=0.5, baseline="rloo", scale_std=False), **STEPS)
    # step 0: 1 - 0.25, 0 - 0.75, 0.5 - 0.5; step 1: 0 - 1, 1 - 0; step 2: no other rollout -> 0
    assert rloo.advantages.tolist() == [0.75, -0.75, -1.0, 0.0, 1.0, 0.0]


# one rollout, rewards 0.5 after call 0 and 1.0 after call 1 (in that time order), and a second rollout, 2 calls,
# reward 0 after call 1
TWO_REWARDS = dict(calls=[(0, 0), (0, 1), (1, 0), (1, 1)], n_calls=[2, 2], groups=[0, 0],
                   rewards=[(0, 0, 0.5), (0, 1, 1.0), (1, 1, 0.0)])


@pytest.mark.parametrize(("rule", "episode", "step_returns"),
                         [("last", [1.0, 0.0], [1.0, 1.0, 0.0, 0.0]), ("sum", [1.5, 0.0], [1.5, 1.0, 0.0, 0.0])])
def test_episode_reward_rule_is_the_same_in_every_mode(rule: str, episode: list, step_returns: list) -> None:
    kw = dict(scale_std=False, episode_reward=rule)
    ident = credit(CreditConfig(**kw), **TWO_REWARDS)
    assert ident.episode_reward.tolist() == episode and ident.returns.tolist() == [episode[0]] * 2 + [0.0, 0.0]
    step = credit(CreditConfig(mode="step", **kw), **TWO_REWARDS)
    assert step.returns.tolist() == step_returns  # with "last" the 0.5 after call 0 is not a reward
    # at step 0 both modes compare the same totals: R_0 - mean_g R
    assert step.advantages[0] == ident.advantages[0] == pytest.approx(episode[0] / 2)


def test_default_episode_reward_keeps_the_last_reward() -> None:
    assert CreditConfig().episode_reward == "last"
    with pytest.raises(ConfigError, match=r"^episode_reward must be one of last, sum; got 'mean'$"):
        CreditConfig(episode_reward="mean").validate()


@pytest.mark.parametrize("fields", [{"mode": "step"}, {"mode": "discounted", "gamma": 0.9}, {"step_group_weight": 1.0},
                                    {}])
def test_aggregation_keeps_per_call_credit_so_every_mode_but_gae_may_merge(fields: dict) -> None:
    CreditConfig(trajectory_aggregation=True, **fields).validate()  # token_advantages: test_token_advantages.py


def test_aggregation_with_gae_is_refused(collector: Any) -> None:
    message = (r"^trajectory_aggregation \(or aggregate=True\) merges a conversation's calls into one sample with one "
               r"value target, but mode='gae' \(PPO's critic\) gives each call its own: turn aggregation off")
    with pytest.raises(ConfigError, match=message):
        CreditConfig(mode="gae", baseline="none", trajectory_aggregation=True).validate()
    with pytest.raises(ConfigError, match=message):
        load_transitions(collector.store, credit=CreditConfig(mode="gae", baseline="none"), aggregate=True)


def test_a_step_one_rollout_reached_alone_is_not_an_unscaled_group() -> None:
    # STEPS: step 2 is C's alone (compared with no one); steps 0 and 1 have stds 0.5 and sqrt(0.5)
    assert credit(CreditConfig(mode="step", gamma=0.5), **STEPS).report["unscaled_groups"] == 0
    # all rewarded 1 (gamma 1): every step two rollouts reached has std 0
    assert credit(CreditConfig(mode="step"), **UNEQUAL).report["unscaled_groups"] == 1

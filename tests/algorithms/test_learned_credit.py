"""The learned critic's GAE term (``algorithms/learned_credit.py``) on a fixed tiny batch worked out by hand, and
its config's validation. The value head on the tiny model: test_value_head.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_credit import credit

from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.learned_credit import CriticConfig, critic_terms
from spanrl.errors import ConfigError

# Rollout 0 (task 0): 3 calls, reward 0.5 after call 0 and 1.0 after call 2. Rollout 1 (task 0): 2 calls, reward
# 0 after call 1. Rollout 2 (task 1): calls at steps 0 and 2 only (step 1 is another agent's, not selected), reward
# 1 after step 1. Rollout 3 (task 1): no reward (skipped). Calls listed out of order on purpose.
CALLS = [(0, 2), (1, 0), (0, 0), (2, 2), (0, 1), (1, 1), (2, 0), (3, 0)]
VALUES = {(0, 0): 0.2, (0, 1): 0.4, (0, 2): 0.6, (1, 0): 0.3, (1, 1): 0.1, (2, 0): 0.5, (2, 2): 0.5, (3, 0): np.nan}
REWARDS = [(0, 0, 0.5), (0, 2, 1.0), (1, 1, 0.0), (2, 1, 1.0)]
CRITIC = CriticConfig(weight=2.0, gamma=0.9, lam=0.5)
# gamma * lam = 0.45. Rollout 0: r = (0.5, 0, 1), V = (0.2, 0.4, 0.6):
#   delta_2 = 1 - 0.6 = 0.4;  delta_1 = 0 + 0.9 * 0.6 - 0.4 = 0.14;  delta_0 = 0.5 + 0.9 * 0.4 - 0.2 = 0.66
#   A_2 = 0.4;  A_1 = 0.14 + 0.45 * 0.4 = 0.32;  A_0 = 0.66 + 0.45 * 0.32 = 0.804;  G = (0.5 + 0.81, 0.9, 1)
# Rollout 1: r = (0, 0), V = (0.3, 0.1): delta_1 = -0.1, delta_0 = 0.09 - 0.3 = -0.21, A = (-0.255, -0.1), G = 0
# Rollout 2: chain (step 0, step 2), the reward after step 1 goes to step 0: r = (1, 0), V = (0.5, 0.5):
#   delta_1 = -0.5, delta_0 = 1 + 0.45 - 0.5 = 0.95, A = (0.95 - 0.225, -0.5) = (0.725, -0.5), G = (1, 0)
GAE = {(0, 0): 0.804, (0, 1): 0.32, (0, 2): 0.4, (1, 0): -0.255, (1, 1): -0.1, (2, 0): 0.725, (2, 2): -0.5}
TO_GO = {(0, 0): 1.31, (0, 1): 0.9, (0, 2): 1.0, (1, 0): 0.0, (1, 1): 0.0, (2, 0): 1.0, (2, 2): 0.0}


def _run(config: CreditConfig):
    return credit(config, calls=CALLS, n_calls=[3, 2, 3, 1], groups=[0, 0, 1, 1], rewards=REWARDS,
                  values=[VALUES[c] for c in CALLS])


def test_gae_term_and_returns_to_go_by_hand() -> None:
    keep = np.array([c[0] != 3 for c in CALLS])
    r = np.array(REWARDS)
    gae, to_go = critic_terms(CRITIC, np.array([VALUES[c] for c in CALLS]),
                              call_rollout=np.array([c[0] for c in CALLS]), call_step=np.array([c[1] for c in CALLS]),
                              call_keep=keep, r_roll=r[:, 0].astype(np.int64), r_step=r[:, 1].astype(np.int64),
                              r_val=r[:, 2])
    assert dict(zip(CALLS[:-1], gae[:-1].tolist())) == pytest.approx(GAE)
    assert dict(zip(CALLS[:-1], to_go[:-1].tolist())) == pytest.approx(TO_GO)
    assert np.isnan(gae[-1]) and np.isnan(to_go[-1])  # rollout 3 is not kept


def test_critic_adds_its_weighted_term_to_the_group_advantage() -> None:
    base = CreditConfig(episode_reward="sum")
    plain, learned = _run(base), _run(dataclasses.replace(base, critic=CRITIC))
    # task 0: episodes 1.5 and 0, mean 0.75, std (ddof 1) 0.75 * sqrt(2): A^mode = +-1/sqrt(2); task 1: one kept
    # rollout, its group alone: A^mode = 0
    mode = {0: 2**-0.5, 1: -(2**-0.5), 2: 0.0}
    for i, (roll, step) in enumerate(CALLS[:-1]):
        assert plain.advantages[i] == pytest.approx(mode[roll])
        assert learned.advantages[i] == pytest.approx(mode[roll] + 2.0 * GAE[(roll, step)])
        assert learned.value_targets[i] == pytest.approx(TO_GO[(roll, step)])
    assert np.isnan(learned.advantages[-1]) and plain.value_targets is None


def test_episode_reward_last_keeps_only_the_final_reward_for_the_critic_too() -> None:
    result = _run(CreditConfig(critic=dataclasses.replace(CRITIC, weight=1.0)))
    # rollout 0 under "last": r = (0, 0, 1): G = (0.81, 0.9, 1)
    targets = dict(zip(CALLS, result.value_targets.tolist()))
    assert [targets[(0, s)] for s in range(3)] == pytest.approx([0.81, 0.9, 1.0])


def test_identical_rewards_give_zero_mode_advantage_and_only_the_critics_term() -> None:
    result = credit(CreditConfig(critic=CriticConfig(weight=1.0, gamma=1.0, lam=1.0)),
                    calls=[(0, 0), (0, 1), (1, 0)], n_calls=[2, 1], groups=[0, 0],
                    rewards=[(0, 1, 1.0), (1, 0, 1.0)], values=[0.5, 0.75, 0.25])
    # lam = 1: A^V = G - V = (1 - 0.5, 1 - 0.75, 1 - 0.25)
    assert result.advantages.tolist() == pytest.approx([0.5, 0.25, 0.75])


def test_critic_needs_finite_values_for_kept_calls() -> None:
    config = CreditConfig(critic=CRITIC)
    with pytest.raises(ConfigError, match=r"values must be given \(one critic value per call\) when critic is set"):
        credit(config, calls=CALLS, n_calls=[3, 2, 3, 1], groups=[0, 0, 1, 1], rewards=REWARDS)
    values = [VALUES[c] for c in CALLS]
    values[2] = np.nan  # call (0, 0) of a kept rollout
    with pytest.raises(ConfigError, match=r"values must be finite for every call of a kept rollout; call 2 has nan"):
        credit(config, calls=CALLS, n_calls=[3, 2, 3, 1], groups=[0, 0, 1, 1], rewards=REWARDS, values=values)


def test_critic_section_from_a_mapping_defaults_and_validation() -> None:
    config = CreditConfig(critic={"weight": 0.5, "lam": 1.0})
    config.validate()
    assert config.critic == CriticConfig(weight=0.5, lam=1.0) and CreditConfig().critic is None
    assert dataclasses.replace(config, gamma=0.5).critic == config.critic
    with pytest.raises(ConfigError, match=r"critic has unknown field\(s\) 'lamda'; allowed: depth, epochs, gamma, lam, "
                                          r"learning_rate, warmup_steps, weight"):
        CreditConfig(critic={"lamda": 1.0})
    with pytest.raises(ConfigError, match=r"critic must be None or a mapping of weight, gamma, lam, learning_rate, "
                                          r"epochs, warmup_steps, depth; got 'yes'"):
        CreditConfig(critic="yes")


@pytest.mark.parametrize(("fields", "message"), [
    ({"weight": -1.0}, "critic.weight must be a finite number >= 0, got -1.0"),
    ({"weight": float("inf")}, "critic.weight must be a finite number >= 0, got inf"),
    ({"gamma": 1.5}, "critic.gamma must be a number in [0, 1], got 1.5"),
    ({"lam": True}, "critic.lam must be a number in [0, 1], got True"),
    ({"learning_rate": 0.0}, "critic.learning_rate must be a finite number > 0, got 0.0"),
    ({"epochs": 0}, "critic.epochs must be an integer >= 1, got 0"),
    ({"warmup_steps": 1.5}, "critic.warmup_steps must be an integer >= 0, got 1.5"),
    ({"depth": 0}, "critic.depth must be a number in (0, 1], got 0"),
])
def test_each_bad_critic_field_is_named(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        CreditConfig(critic=fields).validate()
    assert str(err.value) == message


@pytest.mark.parametrize("fields", [{"mode": "gae", "baseline": "none"}, {"baseline": "running"}])
def test_critic_refused_with_ppos_gae_or_the_running_baseline(fields: dict) -> None:
    with pytest.raises(ConfigError, match=r"critic must be None with mode 'gae' \(PPO's critic is the baseline\) or "
                                          r"baseline 'running'"):
        CreditConfig(critic={}, **fields).validate()


def test_a_yaml_critic_section_builds_the_trainers_credit(tmp_path) -> None:
    from spanrl.trainer.train_config import build_trainer

    raw = {"model": {"tiny": {"words": ["a", "b"]}}, "agent": "python a.py", "tasks": [{"id": "a"}],
           "tasks_per_step": 1, "output_dir": str(tmp_path / "run"), "credit": {"critic": {"weight": 0.5}}}
    assert build_trainer(raw, base=tmp_path).credit.critic == CriticConfig(weight=0.5)
    raw["credit"] = {"critic": {"wieght": 0.5}}
    with pytest.raises(ConfigError, match=r"critic has unknown field\(s\) 'wieght'"):
        build_trainer(raw, base=tmp_path)


def test_the_viewer_shows_a_critic_runs_credit_without_the_heads_term(tmp_path) -> None:
    import json

    from spanrl.ui.runs import Run
    from spanrl.ui.server import credit_of_runs

    trained = CreditConfig(baseline="rloo", critic=CriticConfig(weight=0.5))
    (tmp_path / "config.json").write_text(json.dumps({"algorithm": {"name": "GRPO"},
                                                      "credit": dataclasses.asdict(trained)}))
    assert credit_of_runs([Run(tmp_path, "run")]) == dataclasses.replace(trained, critic=None)

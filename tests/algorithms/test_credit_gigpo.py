"""GiGPO's state-grouped advantage (``CreditConfig.step_group_weight``) on arrays worked out by hand.

A task group of four rollouts with two calls each: every first call has the same prompt (state 0);
rollouts 0 and 1 then saw one tool result (state 1), rollouts 2 and 3 another (state 2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from spanrl.algorithms.credit import CreditConfig, assign_credit, state_ids
from spanrl.errors import ConfigError

CALLS = [(r, t) for r in range(4) for t in range(2)]
STATES = [0, 1, 0, 1, 0, 2, 0, 2]  # per call, in CALLS order


def gigpo(config: CreditConfig, rewards: list[float], states: list[int] | None = STATES, groups=(0, 0, 0, 0)):
    return assign_credit(
        config,
        call_rollout=np.array([c[0] for c in CALLS]), call_step=np.array([c[1] for c in CALLS]),
        rollout_calls=np.array([2, 2, 2, 2]), rollout_group=np.array(groups),
        reward_rollout=np.arange(4), reward_step=np.full(4, 1), reward_value=np.array(rewards, dtype=np.float64),
        reward_time_ns=np.arange(4), call_state=None if states is None else np.array(states),
    )


def test_step_group_term_is_added_to_the_episode_advantage() -> None:
    # R = [1, 1, 0, 1], mean 0.75: episode term R - 0.75 on both calls. Step 0 (one state for all four):
    # the same again. Step 1: state 1 holds R = [1, 1] (term 0, 0), state 2 holds R = [0, 1] (-0.5, +0.5).
    result = gigpo(CreditConfig(scale_std=False, step_group_weight=1.0), [1, 1, 0, 1])
    expected = [0.5, 0.25, 0.5, 0.25, -1.5, -1.25, 0.5, 0.75]
    np.testing.assert_allclose(result.advantages, expected)
    assert result.report["step_groups"] == 3


def test_step_group_weight_scales_only_the_step_term() -> None:
    plain = gigpo(CreditConfig(scale_std=False), [1, 1, 0, 1], states=None).advantages
    half = gigpo(CreditConfig(scale_std=False, step_group_weight=0.5), [1, 1, 0, 1]).advantages
    episode = np.array([0.25, 0.25, 0.25, 0.25, -0.75, -0.75, 0.25, 0.25])  # R - 0.75 on both calls
    step_term = np.array([0.25, 0, 0.25, 0, -0.75, -0.5, 0.25, 0.5])  # as above: step 0 the episode term again
    np.testing.assert_allclose(plain, episode)
    np.testing.assert_allclose(half, episode + 0.5 * step_term)


def test_step_term_is_scaled_by_the_step_groups_std() -> None:
    # state 2's returns [0, 1]: std (ddof 1) 0.7071, so its calls get -/+0.5 / 0.7071 = -/+0.7071
    result = gigpo(CreditConfig(step_group_weight=1.0), [1, 1, 0, 1])
    episode = (np.array([1, 1, 0, 1]) - 0.75) / np.std([1, 1, 0, 1], ddof=1)
    step1 = np.array([0.0, 0.0, -0.5, 0.5]) / (np.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(result.advantages[1::2], episode + step1, rtol=1e-5)
    np.testing.assert_allclose(result.advantages[0::2], 2 * episode, rtol=1e-5)  # step 0: one state for all


def test_identical_rollouts_get_zero_at_every_step() -> None:
    result = gigpo(CreditConfig(step_group_weight=1.0), [1, 1, 1, 1])
    np.testing.assert_array_equal(result.advantages, np.zeros(8))


def test_a_state_no_other_rollout_reached_adds_nothing() -> None:
    states = [0, 1, 0, 2, 0, 3, 0, 4]  # every second call alone in its step group
    result = gigpo(CreditConfig(scale_std=False, step_group_weight=1.0), [1, 1, 0, 1], states=states)
    np.testing.assert_allclose(result.advantages[1::2], [0.25, 0.25, -0.75, 0.25])
    assert result.report["step_groups"] == 1  # step 0's; a call alone is no step group


def test_a_step_group_whose_std_is_eps_is_scaled() -> None:
    # R = [2, 2, 0, 2], eps 1: the task group and step 0 have std (ddof 1) exactly 1 = eps, so both terms are
    # (R - 1.5) / (1 + 1); step 1's state 2 holds [0, 2] (-/+1 over sqrt 2 + 1), state 1's [2, 2] std 0: 0
    result = gigpo(CreditConfig(step_group_weight=1.0, eps=1.0), [2, 2, 0, 2])
    s2 = 1 / (np.sqrt(2) + 1)
    np.testing.assert_allclose(result.advantages, [0.5, 0.25, 0.5, 0.25, -1.5, -0.75 - s2, 0.5, 0.25 + s2])


def test_no_calls_give_no_advantages() -> None:
    none = np.array([], dtype=np.int64)
    result = assign_credit(
        CreditConfig(step_group_weight=1.0), call_rollout=none, call_step=none, rollout_calls=none,
        rollout_group=none, reward_rollout=none, reward_step=none, reward_value=np.array([]), reward_time_ns=none,
        call_state=none,
    )
    assert result.advantages.shape == (0,) and result.report["step_groups"] == 0


def test_states_of_different_task_groups_never_mix() -> None:
    # the same state ids in two task groups of two: each step group is within one task
    result = gigpo(CreditConfig(scale_std=False, step_group_weight=1.0), [1, 0, 0, 1], groups=(0, 0, 1, 1),
                   states=[0, 1, 0, 1, 0, 1, 0, 1])
    np.testing.assert_allclose(result.advantages, [1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0])


def test_state_ids_are_equal_exactly_for_equal_token_ids() -> None:
    assert state_ids([[1, 2, 3], [1, 2], [1, 2, 3], None, []]).tolist() == [0, 1, 0, 2, 2]


@pytest.mark.parametrize(("fields", "message"), [
    ({"step_group_weight": -1.0}, r"step_group_weight must be a finite number >= 0, got -1.0"),
    ({"step_group_weight": float("inf")}, r"step_group_weight must be a finite number >= 0, got inf"),
    ({"step_group_weight": True}, r"step_group_weight must be a finite number >= 0, got True"),
    ({"step_group_weight": 1.0, "mode": "gae", "baseline": "none"},
     r"step_group_weight must be 0 when mode is 'gae' \(the critic is the baseline\)"),
])
def test_bad_step_group_weight_fails_with_its_message(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{message}$"):
        CreditConfig(**fields).validate()


def test_step_group_weight_needs_call_states() -> None:
    with pytest.raises(ConfigError, match="call_state must give one state per call"):
        gigpo(CreditConfig(step_group_weight=1.0), [1, 1, 0, 1], states=None)


def test_step_term_compares_the_discounted_step_return_with_its_own_gamma() -> None:
    # a: 2 calls, b: 3 calls, both rewarded 1 after their last call; states: step 0 shared, a's and b's step 1
    # shared (X), b's step 2 alone (Y). step_gamma 0.5: step returns a [0.5, 1], b [0.25, 0.5, 1]
    result = assign_credit(
        CreditConfig(scale_std=False, step_group_weight=1.0, step_gamma=0.5),
        call_rollout=np.array([0, 0, 1, 1, 1]), call_step=np.array([0, 1, 0, 1, 2]), rollout_calls=np.array([2, 3]),
        rollout_group=np.array([0, 0]), reward_rollout=np.array([0, 1]), reward_step=np.array([1, 2]),
        reward_value=np.array([1.0, 1.0]), reward_time_ns=np.arange(2), call_state=np.array([0, 1, 0, 1, 2]))
    # episode term 0 (equal rewards); state 0: [0.5, 0.25] mean 0.375; X: [1, 0.5] mean 0.75; Y alone: 0
    assert result.advantages.tolist() == [0.125, 0.25, -0.125, -0.25, 0.0]
    assert result.returns.tolist() == [1.0] * 5  # the mode's returns are unchanged (identical)


def test_the_message_state_leaves_out_call_ids_but_not_ids_the_environment_returned() -> None:
    from spanrl.algorithms.gigpo import message_state_key

    def tool_turn(call_id: str, response: Any) -> list[dict[str, Any]]:
        return [{"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": "orders"}]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": response}]}]

    assert message_state_key(tool_turn("call_a", "shipped")) == message_state_key(tool_turn("call_b", "shipped"))
    assert (message_state_key([{"role": "tool", "tool_call_id": "call_a", "content": "8"}])
            == message_state_key([{"role": "tool", "tool_call_id": "call_b", "content": "8"}]))  # OpenAI's shape
    # the orders the tool returned differ only in their id: two states
    assert (message_state_key(tool_turn("call_a", {"id": 17, "status": "shipped"}))
            != message_state_key(tool_turn("call_a", {"id": 18, "status": "shipped"})))

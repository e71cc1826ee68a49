"""The quick-start API: AgentEnv / RewardFunction episodes against a scripted OpenAI-compatible server,
config errors, and the quick-start Trainer through the real pipeline on a tiny model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from spanrl.quickstart import AgentEnv, DeployedAgent, RewardFunction, Trainer, run_episode
from spanrl.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fake_openai import FakeOpenAI  # noqa: E402

from examples.quickstart.arith import VOCAB, ArithEnv, ArithReward, make_tasks  # noqa: E402


def _client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)


def test_episode_feeds_observations_and_scores_the_trajectory():
    replies = iter(["5", "7"])
    with FakeOpenAI(reply=lambda body: next(replies)) as server:
        env = ArithEnv({"question": "add 3 4", "answer": "7"})
        trajectory = run_episode(env, _client(server), "m", temperature=0.0, max_tokens=2)
        second = server.requests[1].body
    assert trajectory.actions == ["5", "7"] and trajectory.step_rewards == [0.0, 1.0]
    assert [m["content"] for m in second["messages"]] == ["add 3 4", "5", "wrong try again"]
    assert second["max_tokens"] == 2 and second["temperature"] == 0.0
    assert ArithReward().compute(env, trajectory) == 0.5


def test_episode_stops_at_max_turns():
    with FakeOpenAI(reply="0") as server:
        env = ArithEnv({"question": "add 3 4", "answer": "7"})
        trajectory = run_episode(env, _client(server), "m")
        assert len(server.requests) == 2
    assert env.done and trajectory.final_action == "0" and ArithReward().compute(env, trajectory) == 0.0


def test_episode_rejects_a_step_that_returns_a_non_number():
    class Bad(ArithEnv):
        def step(self, action):
            super().step(action)
            return "great"

    with FakeOpenAI(reply="7") as server, pytest.raises(TypeError,
                                                        match="Bad.step must return a number or None, got 'great'"):
        run_episode(Bad({"question": "add 3 4", "answer": "7"}), _client(server), "m")


def test_deployed_agent_runs_a_question_greedily():
    with FakeOpenAI(reply="7") as server:
        answer = DeployedAgent(ArithEnv, _client(server), max_tokens=2).run("add 3 4")
        assert server.requests[0].body["temperature"] == 0.0
    assert answer == "7"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env_class": dict}, "env_class must be a subclass of AgentEnv, got <class 'dict'>"),
        ({"reward_class": object}, "reward_class must be a subclass of RewardFunction"),
        ({"algorithm": "reinforce"}, r"algorithm must be one of \('grpo', 'ppo', 'sft', 'dpo'\), got 'reinforce'"),
        ({"batch_size": 2, "n_rollouts": 4}, r"batch_size \(2\) must be at least n_rollouts \(4\)"),
        ({"total_steps": 0}, "total_steps must be a positive integer, got 0"),
        ({"learning_rate": -1.0}, "learning_rate must be > 0, got -1.0"),
    ],
)
def test_trainer_rejects_bad_arguments(tmp_path, kwargs, message):
    args = {"model": tmp_path, "env_class": ArithEnv, "reward_class": ArithReward, "tasks": make_tasks(4),
            "output_dir": tmp_path / "run", **kwargs}
    with pytest.raises(ConfigError, match=message):
        Trainer(**args)


def test_trainer_needs_tasks_when_the_env_has_no_defaults(tmp_path):
    class NoDefaults(AgentEnv):
        def get_observation(self):
            return "x"

        def step(self, action):
            return None

        @property
        def done(self):
            return True

    class Zero(RewardFunction):
        def compute(self, env, trajectory):
            return 0.0

    with pytest.raises(ConfigError, match="tasks is required: NoDefaults has no default_tasks"):
        Trainer(model=tmp_path, env_class=NoDefaults, reward_class=Zero)


def test_trainer_trains_and_deploys_through_the_pipeline(tmp_path):
    from spanrl.demo.tiny import CALL_CLOSE, CALL_OPEN, ROLE_WORDS, build_tiny_model

    from training_checks import assert_served_policy_changed, assert_trained, prime_half_right

    model = build_tiny_model(tmp_path / "model", words=VOCAB, hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64)
    tasks = make_tasks(6)
    # right or wrong on the first turn with odds ~1/2 each (primed here to P(right) 0.36-0.45). Both groups
    # then have equal rewards (no gradient, nothing trained) with probability ~3e-4 for groups of 8 at 0.4;
    # groups of 4 (~2.5% at 0.4) failed CI that way once.
    prime_half_right(model,
                     [([{"role": "user", "content": t["question"]}], t["answer"], str((int(t["answer"]) + 1) % 19))
                             for t in tasks[:4]])
    trainer = Trainer(model=model, env_class=ArithEnv, reward_class=ArithReward, tasks=tasks[:4], val_tasks=tasks[4:],
                      algorithm="grpo", learning_rate=1e-3, total_steps=1, batch_size=16, n_rollouts=8, max_tokens=2,
                      output_dir=tmp_path / "run")
    with trainer:
        history = trainer.train()
        client = trainer.trainer.deploy()
        assert_served_policy_changed(client, [{"role": "user", "content": tasks[0]["question"]}],
                                     initial=model, checkpoint=tmp_path / "run" / "checkpoint-1")
        answer = trainer.deploy().run("add 3 4")
        assert history[-1]["val_success"] == trainer.evaluate()  # the figure is the trained policy's greedy score
    step = history[-1]
    assert step["rollouts_ok"] == 16 and step["policy_version"] == 1
    assert step["transitions"] >= 16  # one per turn, up to two turns each
    assert_trained(step, initial=model, checkpoint=tmp_path / "run" / "checkpoint-1")
    tokens = set(VOCAB) | set(ROLE_WORDS.values()) | {CALL_OPEN, CALL_CLOSE}
    assert isinstance(answer, str) and set(answer.split()) <= tokens  # the tiny policy's own words


@pytest.mark.parametrize(("name", "cls"), [("grpo", "GRPO"), ("PPO", "PPO"), ("dpo", "DPO"), ("sft", "SFT")])
def test_trainer_maps_algorithm_names_and_learning_rate(tmp_path, name, cls):
    trainer = Trainer(model=tmp_path, env_class=ArithEnv, reward_class=ArithReward, tasks=make_tasks(8), algorithm=name,
                      learning_rate=2e-4, batch_size=8, n_rollouts=4, output_dir=tmp_path / "run")
    algorithm = trainer.trainer.algorithm
    assert type(algorithm).__name__ == cls and algorithm.config.learning_rate == 2e-4
    assert trainer.trainer.config.tasks_per_step == 2 and trainer.trainer.config.n_rollouts == 4

"""The quick-start API: write an environment and a reward function, get a trained, deployed agent.

    class Guess(AgentEnv):
        def get_observation(self): return self.feedback or self.task["question"]
        def step(self, action): ...            # update state; may return an intermediate reward
        @property
        def done(self): return self.solved or self.turns >= 3

    class Exact(RewardFunction):
        def compute(self, env, trajectory): return float(trajectory.final_action == env.task["answer"])

    trainer = Trainer(model="tiny-model/", env_class=Guess, reward_class=Exact, tasks=tasks,
                      algorithm="grpo", learning_rate=5e-4, total_steps=20, batch_size=16, output_dir="run/")
    trainer.train()
    print(trainer.deploy().run("what is 3 plus 4?"))

How it maps onto spanrl: ``env_agent(env_class, reward_class)`` is an ordinary callable agent
``agent(task, llm)``. Each rollout builds ``env_class(task)``, then repeats: the observation becomes a
user message, the policy's reply is the action, ``env.step(action)`` advances the state, until
``env.done`` or ``max_turns``. The reward function scores the finished trajectory and the reward is
emitted as a span (``spanrl.emit_reward``); the LLM calls are traced like any agent's, so this trains
through exactly the same spans -> transitions -> update path as every other agent. :class:`Trainer`
wraps :class:`spanrl.trainer.trainer.Trainer` (which runs the loop) with the flat arguments above.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spanrl.algorithms import ALGORITHMS as _REGISTRY, PROMPT_ALGORITHMS
from spanrl.errors import ConfigError, positive_int, positive_number

__all__ = [
    "ALGORITHMS",
    "AgentEnv",
    "DeployedAgent",
    "RewardFunction",
    "Trainer",
    "Trajectory",
    "Turn",
    "env_agent",
    "run_episode",
]

ALGORITHMS = tuple(name for name in _REGISTRY if name not in PROMPT_ALGORITHMS)
"""Names from :data:`spanrl.algorithms.ALGORITHMS` the quick-start ``Trainer`` accepts (case-insensitive;
APO needs a prompt template, which the quick-start API has not)."""

DEFAULT_MAX_TURNS = 8
DEFAULT_N_ROLLOUTS = 4
DEFAULT_MAX_TOKENS = 64


# --- Environment and reward -----------------------------------------------------------------------------
class AgentEnv(abc.ABC):
    """One episode of an environment, built from one task (``env_class(task)``).

    Subclasses implement :meth:`get_observation` (what the policy sees next: text), :meth:`step` (apply
    the policy's text action; may return an intermediate reward, a number, or None) and :attr:`done`.
    ``system_prompt`` (class attribute) opens the conversation when set; ``max_turns`` caps the episode.
    """

    system_prompt: str | None = None
    max_turns: int = DEFAULT_MAX_TURNS

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = task

    @abc.abstractmethod
    def get_observation(self) -> str:
        """The text the policy sees before its next action."""

    @abc.abstractmethod
    def step(self, action: str) -> float | None:
        """Apply ``action``; return an intermediate reward (or None)."""

    @property
    @abc.abstractmethod
    def done(self) -> bool:
        """True once the episode is over."""


@dataclass(frozen=True)
class Turn:
    """One observation -> action -> step of an episode."""

    observation: str
    action: str
    step_reward: float | None = None


@dataclass
class Trajectory:
    """What happened in one episode."""

    task: Mapping[str, Any]
    turns: list[Turn] = field(default_factory=list)

    @property
    def actions(self) -> list[str]:
        return [t.action for t in self.turns]

    @property
    def final_action(self) -> str:
        """The last action ("" when the episode had no turn)."""
        return self.turns[-1].action if self.turns else ""

    @property
    def step_rewards(self) -> list[float]:
        """The intermediate rewards ``step`` returned (None entries dropped)."""
        return [t.step_reward for t in self.turns if t.step_reward is not None]


class RewardFunction(abc.ABC):
    """Scores a finished episode. Built once per rollout (``reward_class()``), so it may keep state."""

    @abc.abstractmethod
    def compute(self, env: AgentEnv, trajectory: Trajectory) -> float:
        """The episode reward (use ``spanrl.instrumentation.rewards.shaped_reward`` to add step rewards)."""


def run_episode(env: AgentEnv, client: Any, model: str, *, temperature: float = 1.0,
                max_tokens: int = DEFAULT_MAX_TOKENS, max_turns: int | None = None) -> Trajectory:
    """Play one episode: observation -> chat completion -> ``env.step`` until done or out of turns."""
    limit = env.max_turns if max_turns is None else max_turns
    positive_int("max_turns", limit)
    messages: list[dict[str, str]] = [{"role": "system", "content": env.system_prompt}] if env.system_prompt else []
    trajectory = Trajectory(task=env.task)
    for _ in range(limit):
        if env.done:
            break
        observation = str(env.get_observation())
        messages.append({"role": "user", "content": observation})
        reply = client.chat.completions.create(model=model, messages=messages, temperature=temperature,
                                               max_tokens=max_tokens)
        action = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": action})
        step_reward = env.step(action)
        if step_reward is not None and (isinstance(step_reward, bool) or not isinstance(step_reward, (int, float))):
            raise TypeError(f"{type(env).__name__}.step must return a number or None, got {step_reward!r}")
        trajectory.turns.append(Turn(observation, action, None if step_reward is None else float(step_reward)))
    return trajectory


def _check_classes(env_class: Any, reward_class: Any) -> None:
    if not (isinstance(env_class, type) and issubclass(env_class, AgentEnv)):
        raise ConfigError(f"env_class must be a subclass of AgentEnv, got {env_class!r}")
    if not (isinstance(reward_class, type) and issubclass(reward_class, RewardFunction)):
        raise ConfigError(f"reward_class must be a subclass of RewardFunction, got {reward_class!r}")


def env_agent(env_class: type[AgentEnv], reward_class: type[RewardFunction], *,
              max_turns: int | None = None) -> Callable[[Mapping[str, Any], Any], None]:
    """A callable agent ``agent(task, llm)`` that plays ``env_class(task)`` and emits the reward of
    ``reward_class().compute(env, trajectory)``. ``llm`` is the trainer's endpoint (base_url, model,
    sampling; see ``spanrl.rollouts.runner.LLMEndpoint``)."""
    _check_classes(env_class, reward_class)

    def agent(task: Mapping[str, Any], llm: Any) -> None:
        import openai

        from spanrl.instrumentation import emit_reward

        sampling = dict(getattr(llm, "sampling", None) or {})
        client = openai.OpenAI(base_url=llm.base_url, api_key=getattr(llm, "api_key", "spanrl"), max_retries=1)
        env = env_class(task)
        trajectory = run_episode(env, client, llm.model, temperature=float(sampling.get("temperature", 1.0)),
                                 max_tokens=int(sampling.get("max_tokens", DEFAULT_MAX_TOKENS)), max_turns=max_turns)
        reward = reward_class().compute(env, trajectory)
        emit_reward(float(reward))

    agent.__name__ = agent.__qualname__ = f"{env_class.__name__}Agent"
    return agent


# --- Trainer and deployment -------------------------------------------------------------------------------
class DeployedAgent:
    """The trained policy behind its environment: ``run("question")`` plays one greedy episode."""

    def __init__(self, env_class: type[AgentEnv], client: Any, *, model: str = "policy",
                 max_tokens: int = DEFAULT_MAX_TOKENS, max_turns: int | None = None) -> None:
        self.env_class = env_class
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.max_turns = max_turns

    def run_episode(self, task: str | Mapping[str, Any]) -> Trajectory:
        """The whole greedy episode for ``task`` (a question string becomes ``{"question": ...}``)."""
        task = {"question": task} if isinstance(task, str) else task
        return run_episode(self.env_class(task), self.client, self.model, temperature=0.0,
                           max_tokens=self.max_tokens, max_turns=self.max_turns)

    def run(self, task: str | Mapping[str, Any]) -> str:
        """The policy's final action for ``task``."""
        return self.run_episode(task).final_action


def _algorithm(name: str, learning_rate: float | None) -> Any:
    from spanrl.algorithms import algorithm_class

    cls = algorithm_class(name, allowed=ALGORITHMS)
    return cls() if learning_rate is None else cls(learning_rate=learning_rate)


class Trainer:
    """Quick-start trainer: ``env_class`` + ``reward_class`` + flat hyperparameters.

    ``batch_size`` is the number of rollouts per update: ``batch_size // n_rollouts`` tasks, each run
    ``n_rollouts`` times (the GRPO group). ``total_steps`` is the number of updates. ``algorithm`` is a
    name (``grpo``, ``ppo``, ``dpo``, ``sft``) or an algorithm object (``GRPO(...)``). ``tasks`` defaults to
    ``env_class.default_tasks()`` when the class defines it. ``progress`` shows the loop's progress bar
    and one line per step (off by default: the API stays quiet inside other programs).
    """

    def __init__(
        self,
        *,
        model: str | Path,
        env_class: type[AgentEnv],
        reward_class: type[RewardFunction],
        tasks: Sequence[Mapping[str, Any]] | None = None,
        val_tasks: Sequence[Mapping[str, Any]] | None = None,
        algorithm: str | Any = "grpo",
        learning_rate: float | None = None,
        total_steps: int = 20,
        batch_size: int = 16,
        n_rollouts: int = DEFAULT_N_ROLLOUTS,
        max_turns: int | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        temperature: float = 1.0,
        output_dir: str | Path = "spanrl-run",
        seed: int = 0,
        progress: bool = False,
    ) -> None:
        _check_classes(env_class, reward_class)
        for name, value in (("total_steps", total_steps), ("batch_size", batch_size), ("n_rollouts", n_rollouts)):
            positive_int(name, value)
        if batch_size < n_rollouts:
            raise ConfigError(f"batch_size ({batch_size}) must be at least n_rollouts ({n_rollouts})")
        if learning_rate is not None:  # None: the algorithm's default
            positive_number("learning_rate", learning_rate)
        if tasks is None:
            default_tasks = getattr(env_class, "default_tasks", None)
            if default_tasks is None:
                raise ConfigError(f"tasks is required: {env_class.__name__} has no default_tasks()")
            tasks = list(default_tasks())
        algo = _algorithm(algorithm, learning_rate) if isinstance(algorithm, str) else algorithm
        if not isinstance(algorithm, str) and learning_rate is not None:
            raise ConfigError("learning_rate applies to an algorithm given by name; set it in the algorithm object")
        from spanrl.trainer.trainer import Trainer as LoopTrainer
        from spanrl.trainer.trainer import TrainerConfig

        self.env_class = env_class
        self.reward_class = reward_class
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.agent = env_agent(env_class, reward_class, max_turns=max_turns)
        self.trainer = LoopTrainer(
            model=model,
            agent=self.agent,
            tasks=list(tasks),
            val_tasks=list(val_tasks) if val_tasks else None,
            algorithm=algo,
            n_rollouts=n_rollouts,
            tasks_per_step=min(len(tasks), max(1, batch_size // n_rollouts)),
            max_steps=total_steps,
            output_dir=output_dir,
            seed=seed,
            config=TrainerConfig(temperature=temperature, max_tokens=max_tokens, progress=progress),
        )

    def train(self) -> list[dict[str, Any]]:
        """Run ``total_steps`` updates; return the loop's history (one dict per step)."""
        return self.trainer.train()

    def evaluate(self, tasks: Sequence[Mapping[str, Any]] | None = None) -> float:
        """Mean greedy reward on ``tasks`` (default: ``val_tasks``)."""
        return self.trainer.evaluate(tasks)

    def deploy(self) -> DeployedAgent:
        """Serve the trained policy; ``.run("question")`` answers through the environment."""
        return DeployedAgent(self.env_class, self.trainer.deploy(), max_tokens=self.max_tokens,
                             max_turns=self.max_turns)

    def close(self) -> None:
        """Stop the servers ``deploy`` or ``evaluate`` left running; safe twice."""
        self.trainer.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The credit configuration: `CreditConfig` (every field validated), `LightningRL` (Agent Lightning's name
for it) and `aggregation_conflict`. The formulas they select are ``algorithms/credit.py``'s docstring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from spanrl.algorithms.learned_credit import CriticConfig, critic_config
from spanrl.algorithms.step_signals import check_step_signals
from spanrl.errors import ConfigError

__all__ = ["CreditConfig", "LightningRL", "aggregation_conflict", "default_config"]

CreditMode = Literal["identical", "discounted", "step", "gae"]
Baseline = Literal["grpo", "rloo", "none", "running"]
_MODES = ("identical", "discounted", "step", "gae")
_BASELINES = ("grpo", "rloo", "none", "running")
_MISSING_POLICIES = ("skip", "zero")
_NAN_POLICIES = ("skip", "zero", "ignore")
_EPISODE_REWARDS = ("last", "sum")


@dataclass
class CreditConfig:
    """How rewards become advantages. ``default_config()`` gives the LightningRL defaults."""

    mode: CreditMode = "identical"
    """identical | discounted | step | gae (see the module docstring)."""
    gamma: float = 1.0
    """Discount per call, in [0, 1] (discounted, step, gae)."""
    episode_reward: Literal["last", "sum"] = "last"
    """Which rewards of a rollout count, in every mode: the last the collector stored, or the sum of all of them."""
    lam: float = 0.95
    """GAE lambda, in [0, 1] (gae only)."""
    baseline: Baseline = "grpo"
    """grpo | rloo | none: what is subtracted from the return, per task group."""
    scale_std: bool = True
    """Divide by the group std (grpo, rloo), or whiten the batch (none)."""
    per_rollout: bool = True
    """Group statistics over one value per rollout (True) or one per call (False, Agent Lightning)."""
    reward_name: str | None = None
    """Only rewards of this name (``spanrl.reward.name`` / ``gen_ai.evaluation.name``); None: every reward."""
    missing_reward: Literal["skip", "zero"] = "skip"
    """A rollout without a reward: skip its calls, or score it 0."""
    nan_reward: Literal["skip", "zero", "ignore"] = "skip"
    """A NaN reward (the store reads an unusable one as NaN): skip its whole rollout, count the reward as 0, or
    ``ignore`` it (the rollout's other rewards count: with ``last``, the latest usable one; none left: a rollout
    without a reward, ``missing_reward``). The online trainer ignores them."""
    eps: float = 1e-6
    """Added to the std before dividing; a std below it is not divided by."""
    step_group_weight: float = 0.0
    """GiGPO's omega: weight of the step-group (same observed state) advantage added to each call's; 0: off."""
    step_gamma: float = 1.0
    """GiGPO's discount of the step return its step groups compare, in [0, 1] (the paper uses 0.95)."""
    trajectory_aggregation: bool = False
    """Merge consecutive calls of one conversation into one sample (``load_transitions(aggregate=True)``)."""
    step_signals: dict[str, float] | None = None
    """Trace facts -> a per-step reward each (``algorithms/step_signals.py``), e.g. ``{"tool_error": -0.2}``;
    None: off. Modes ``step`` and ``gae`` only."""
    critic: CriticConfig | None = None
    """A learned value head's GAE term added to each call's advantage (``algorithms/learned_credit.py``); None: off.
    A mapping of its fields (a YAML ``critic:`` section) is read as one."""

    def __post_init__(self) -> None:
        if self.critic is not None:  # off by default: learned_credit.py stays off the span's path
            self.critic = critic_config(self.critic)

    def validate(self) -> None:
        """Raise `ConfigError` naming the first bad field, its value and what is allowed."""
        if self.mode not in _MODES:
            raise ConfigError(f"mode must be one of {', '.join(_MODES)}; got {self.mode!r}")
        if self.baseline not in _BASELINES:
            raise ConfigError(f"baseline must be one of {', '.join(_BASELINES)}; got {self.baseline!r}")
        for name in ("gamma", "lam", "step_gamma"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name} must be a number in [0, 1], got {value!r}")
        if self.mode == "gae" and self.baseline != "none":
            raise ConfigError(
                f"baseline must be 'none' when mode is 'gae' (the critic is the baseline), got {self.baseline!r}"
            )
        if self.episode_reward not in _EPISODE_REWARDS:
            raise ConfigError(
                f"episode_reward must be one of {', '.join(_EPISODE_REWARDS)}; got {self.episode_reward!r}")
        if self.missing_reward not in _MISSING_POLICIES:
            raise ConfigError(f"missing_reward must be 'skip' or 'zero', got {self.missing_reward!r}")
        if self.nan_reward not in _NAN_POLICIES:
            raise ConfigError(f"nan_reward must be 'skip', 'zero' or 'ignore', got {self.nan_reward!r}")
        for name in ("scale_std", "per_rollout", "trajectory_aggregation"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a boolean, got {getattr(self, name)!r}")
        if self.reward_name is not None and not isinstance(self.reward_name, str):
            raise ConfigError(f"reward_name must be a string or None, got {self.reward_name!r}")
        w = self.step_group_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w < float("inf"):
            raise ConfigError(f"step_group_weight must be a finite number >= 0, got {w!r}")
        if w and self.mode == "gae":
            raise ConfigError("step_group_weight must be 0 when mode is 'gae' (the critic is the baseline)")
        if not isinstance(self.eps, (int, float)) or not self.eps > 0:
            raise ConfigError(f"eps must be a positive number, got {self.eps!r}")
        if self.step_signals is not None:  # off by default: its module stays off the span's path
            check_step_signals(self.step_signals, self.mode)
        self._validate_critic()
        conflict = aggregation_conflict(self)
        if self.trajectory_aggregation and conflict:
            raise ConfigError(conflict)

    def _validate_critic(self) -> None:
        if self.critic is None:
            return
        self.critic = critic_config(self.critic)  # a field set after construction
        self.critic.validate()
        if self.mode == "gae" or self.baseline == "running":
            raise ConfigError(f"critic must be None with mode 'gae' (PPO's critic is the baseline) or baseline "
                              f"'running'; got mode {self.mode!r}, baseline {self.baseline!r}")


def aggregation_conflict(config: CreditConfig) -> str | None:
    """Why merging a conversation's calls into one sample would lose ``config``'s per-call credit, or None.

    A merged sample carries each call's advantage on that call's tokens (``Transition.token_advantages``),
    which GRPO's loss reads. PPO's ``gae`` also needs each call's value target, and a merged sample has
    one: that combination is refused."""
    if config.mode != "gae":
        return None
    return ("trajectory_aggregation (or aggregate=True) merges a conversation's calls into one sample with one "
            "value target, but mode='gae' (PPO's critic) gives each call its own: turn aggregation off "
            "(--no-aggregate)")


def default_config() -> CreditConfig:
    """A new `CreditConfig` with the defaults: identical rewards, GRPO over rollouts, std scaling."""
    return CreditConfig()


def LightningRL(  # noqa: N802 - a config constructor, named like Agent Lightning's algorithm
    *,
    mode: str = "identical",
    baseline: str = "grpo",
    **fields: Any,
) -> Any:
    """Credit assignment as Agent Lightning users know it: a :class:`~spanrl.algorithms.credit.CreditConfig`.

    ``mode``: how an episode's reward reaches each LLM call (``identical``: every call gets the final
    reward; ``discounted``, ``step``, ``gae``); ``baseline``: ``grpo`` (group mean/std by task),
    ``rloo``, or ``none``. Other ``CreditConfig`` fields pass through by name (e.g. ``gamma``).
    """
    try:
        config = CreditConfig(mode=mode, baseline=baseline, **fields)
    except TypeError as exc:
        raise ConfigError(f"LightningRL got an unknown field: {exc}") from None
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config

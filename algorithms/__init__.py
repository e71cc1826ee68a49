"""spanrl.algorithms: what turns transitions into a better policy.

The ``Algorithm`` contract, GRPO, PPO, SFT, DPO, APO, LoRA (one adapter per agent: ``MultiLoRA``), LightningRL
credit assignment and ``load_transitions`` / ``load_training_batch``. The loop around them: :mod:`spanrl.trainer`.

Public names are loaded on first use, so importing one part does not import them all.
"""

from __future__ import annotations

from spanrl._lazy import lazy_getattr

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "APO": "spanrl.algorithms.apo",
    "APOConfig": "spanrl.algorithms.apo",
    "APOResult": "spanrl.algorithms.apo",
    "AgentPolicy": "spanrl.algorithms.policies",
    "Algorithm": "spanrl.algorithms.base",
    "DPO": "spanrl.algorithms.dpo",
    "DPOConfig": "spanrl.algorithms.dpo",
    "GRPO": "spanrl.algorithms.grpo",
    "GRPOConfig": "spanrl.algorithms.grpo",
    "LightningRL": "spanrl.algorithms.credit",
    "LoRAConfig": "spanrl.algorithms.lora",
    "MultiLoRA": "spanrl.algorithms.policies",
    "MultiLoRAConfig": "spanrl.algorithms.policies",
    "CreditConfig": "spanrl.algorithms.credit",
    "PPO": "spanrl.algorithms.ppo",
    "PPOConfig": "spanrl.algorithms.ppo",
    "SFT": "spanrl.algorithms.sft",
    "SFTConfig": "spanrl.algorithms.sft",
    "TransitionBatch": "spanrl.algorithms.transitions",
    "load_training_batch": "spanrl.algorithms.transitions",
    "load_transitions": "spanrl.algorithms.transitions",
}

ALGORITHMS: dict[str, str] = {"grpo": "GRPO", "ppo": "PPO", "sft": "SFT", "dpo": "DPO", "apo": "APO"}
"""The algorithm registry: the name a train config, the CLI or the quick-start API uses -> class name."""
CREDIT_ALGORITHMS: tuple[str, ...] = ("grpo", "ppo")
"""Registered names that learn from rollouts' rewards through credit assignment (the viewer shows their credit)."""
PROMPT_ALGORITHMS: tuple[str, ...] = ("apo",)
"""Registered names that search prompt templates (they need one to start from) instead of updating weights."""

__all__ = sorted([*_LAZY, "ALGORITHMS", "CREDIT_ALGORITHMS", "PROMPT_ALGORITHMS", "algorithm_class"])


def algorithm_class(name: str, *, field: str = "algorithm", allowed: tuple[str, ...] | None = None) -> type:
    """The class registered as ``name`` (case-insensitive); a ConfigError naming ``field`` and the
    choices (``allowed``, default every registered name) otherwise."""
    from spanrl.errors import ConfigError

    choices = tuple(allowed or ALGORITHMS)
    key = name.lower() if isinstance(name, str) else name
    if key not in choices:
        raise ConfigError(f"{field} must be one of {choices}, got {name!r}")
    return __getattr__(ALGORITHMS[key])


__getattr__ = lazy_getattr(__name__, _LAZY, globals())

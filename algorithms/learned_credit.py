"""Learned per-step credit: a value head's GAE term added to the group baseline's advantage.

``CreditConfig(critic=CriticConfig(...))`` (YAML: a ``critic:`` section of ``credit``). A small value head
``V`` reads the policy's own hidden state (after its first ``depth`` of layers) at each call's last prompt
token (``algorithms/value_head.py``: the trainer's no-grad forward over the calls' prompts, before the update)
and is trained on each batch's per-call returns-to-go. For the kept calls of a rollout, in step order (its chain
of calls ``0..T-1``):

    r_t   = the rewards after call t and before call t + 1 (the last call: every reward after it)
    G_t   = r_t + gamma * G_{t+1},                   G_T = 0       the head's regression target
    delta_t = r_t + gamma * V_{t+1} - V_t,           V_T = 0       the TD error of call t
    A^V_t = delta_t + gamma * lam * A^V_{t+1},       A^V_T = 0     GAE (Schulman et al. 2016, arXiv 1506.02438)

    A_t   = A^mode_t + weight * A^V_t

``A^mode_t`` is the advantage the rest of the credit config gives (``identical`` with ``grpo``: the
group-normalised episode reward; GiGPO's term included). ``r_t`` follows the config's ``episode_reward`` rule
(``last``: only the final reward, on the call before it), as every mode does. The values are the head's before
it learns from this batch (as PPO's old values), so a call's advantage never fits its own return. Rollouts
with identical rewards still get ``A^mode = 0``; their ``A^V`` says which call the head expected more or
less of. With ``lam = 1``, ``A^V_t = G_t - V_t``; with ``lam = 0``, the one-step TD error.

Until the head has trained on ``warmup_steps`` batches its term is not added (``weight`` counts as 0): a head
at ``V = 0`` would add ``weight * G_t`` to every call. ``gae`` (PPO's critic) is its own mode and refuses a
``critic`` section; the head is for the group-baseline algorithms (GRPO).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from spanrl.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

    from spanrl.algorithms.credit_config import CreditConfig

__all__ = ["CallCritic", "CriticConfig", "critic_config", "critic_terms"]


@dataclass
class CriticConfig:
    """The learned value head and its GAE term (module docstring)."""

    weight: float = 1.0
    """Weight of the GAE term ``A^V`` added to the mode's advantage (reward units); 0: the head trains, adds nothing."""
    gamma: float = 1.0
    """Discount per call of the returns-to-go and TD errors, in [0, 1]."""
    lam: float = 0.95
    """GAE lambda, in [0, 1]: 1 = ``G_t - V_t``, 0 = the one-step TD error."""
    learning_rate: float = 1e-2
    """AdamW learning rate of the head."""
    epochs: int = 20
    """Full-batch AdamW steps of the head's regression per training step."""
    warmup_steps: int = 1
    """Batches the head trains on before its term is added (0: from the first batch, at ``V = 0``)."""
    depth: float = 0.25
    """Share of the policy's decoder layers whose output the head reads, in (0, 1]: the hidden state after the
    first ``ceil(depth * L)`` layers (through the final norm); 1 = the last layer's. The head's forward runs only
    those layers: its cost scales with ``depth`` (docs/credit.md)."""

    def validate(self) -> None:
        """Raise `ConfigError` naming the first bad field (as ``critic.<field>``), its value and what is allowed."""
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"critic.{name} must be a number in [0, 1], got {value!r}")
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w < float("inf"):
            raise ConfigError(f"critic.weight must be a finite number >= 0, got {w!r}")
        lr = self.learning_rate
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0.0 < lr < float("inf"):
            raise ConfigError(f"critic.learning_rate must be a finite number > 0, got {lr!r}")
        d = self.depth
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 < d <= 1.0:
            raise ConfigError(f"critic.depth must be a number in (0, 1], got {d!r}")
        for name, low in (("epochs", 1), ("warmup_steps", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"critic.{name} must be an integer >= {low}, got {value!r}")


def critic_config(value: Any) -> CriticConfig | None:
    """``CreditConfig.critic`` as given (None, a `CriticConfig`, or a mapping of its fields, e.g. from YAML)."""
    if value is None or isinstance(value, CriticConfig):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"critic must be None or a mapping of {', '.join(f.name for f in fields(CriticConfig))}; "
                          f"got {value!r}")
    names = {f.name for f in fields(CriticConfig)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise ConfigError(f"critic has unknown field(s) {', '.join(map(repr, unknown))}; allowed: "
                          f"{', '.join(sorted(names))}")
    return CriticConfig(**value)


class CallCritic(Protocol):
    """What ``load_transitions(values=...)`` asks for a learned critic's values (``algorithms/value_head.py``)."""

    def value_calls(self, calls: pa.Table) -> np.ndarray:
        """``V`` (N,) of each call of ``calls`` (columns ``rollout_id``, ``step``, ``agent``, ``prompt_ids``)."""

    def observe_returns(self, returns: np.ndarray) -> None:
        """The same calls' returns-to-go ``G_t`` (NaN on calls of skipped rollouts), once credit is assigned."""


def critic_terms(
    config: CriticConfig | CreditConfig,
    values: np.ndarray,
    *,
    call_rollout: np.ndarray,
    call_step: np.ndarray,
    call_keep: np.ndarray,
    r_roll: np.ndarray,
    r_step: np.ndarray,
    r_val: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per call: ``A^V_t`` and ``G_t`` (module docstring), NaN on calls not kept; ``config`` gives ``gamma`` and
    ``lam`` (the critic's, or the credit config's for mode ``gae``, whose PPO critic values the same chains).
    Each rollout's chain is its kept calls in step order; a reward goes to the last kept call at or before its
    step (rewards before a rollout's first kept call, and those with step -1, credit no call)."""
    n_calls = len(call_rollout)
    gae, to_go = np.full(n_calls, np.nan), np.full(n_calls, np.nan)
    kept = np.flatnonzero(call_keep)
    order = kept[np.lexsort((call_step[kept], call_rollout[kept]))]  # (N,) the chains, one after the other
    roll, step, value = call_rollout[order], call_step[order], np.asarray(values, np.float64)[order]
    reward = np.zeros(len(order))
    if len(order) and len(r_roll):
        span = int(max(step.max(), np.max(r_step))) + 2  # (rollout, step) as one sortable integer
        pos = np.searchsorted(roll * span + step, r_roll * span + r_step, side="right") - 1
        ok = (r_step >= 0) & (pos >= 0)
        ok &= roll[np.clip(pos, 0, None)] == r_roll
        np.add.at(reward, pos[ok], r_val[ok])
    last = np.r_[roll[1:] != roll[:-1], True] if len(order) else np.zeros(0, bool)
    next_value = np.where(last, 0.0, np.r_[value[1:], 0.0])
    delta = reward + config.gamma * next_value - value
    a = g = 0.0
    out_a, out_g = np.zeros(len(order)), np.zeros(len(order))
    for j in range(len(order) - 1, -1, -1):
        a = delta[j] + (0.0 if last[j] else config.gamma * config.lam * a)
        g = reward[j] + (0.0 if last[j] else config.gamma * g)
        out_a[j], out_g[j] = a, g
    gae[order], to_go[order] = out_a, out_g
    return gae, to_go

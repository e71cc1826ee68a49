"""A step's training batch: the rollouts' transitions with advantages from the credit assignment.

For an algorithm with a critic (``needs_values``, e.g. PPO) it takes two passes: the critic values the
states of the first, then GAE with the algorithm's ``gamma``/``lam`` gives raw (unwhitened) advantages;
the credit's selection rules (``reward_name``, ``missing_reward``, ...) are kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["load_batch"]


def load_batch(store: Any, *, algorithm: Any, credit: Any, rollout_ids: Sequence[str], agent_name: str | None = None) -> Any:
    """The :class:`~spanrl.algorithms.transitions.TransitionBatch` of ``rollout_ids`` for ``algorithm``."""
    from spanrl.algorithms.transitions import load_transitions

    kwargs: dict[str, Any] = {"rollout_ids": list(rollout_ids), "tokenizer": algorithm.tokenizer}
    if agent_name:
        kwargs["agents"] = [agent_name]
    if not getattr(algorithm, "needs_values", False):
        return load_transitions(store, credit=credit, **kwargs)
    states = load_transitions(store, credit=dataclasses.replace(credit, mode="identical", baseline="none"), **kwargs)
    if not len(states):
        return states
    algo_cfg = algorithm.config
    # unwhitened: the algorithm's value target is advantages + V(s) (PPO whitens per mini-batch itself)
    gae = dataclasses.replace(credit, mode="gae", gamma=algo_cfg.gamma, lam=algo_cfg.lam, baseline="none", scale_std=False)
    return load_transitions(store, credit=gae, values=algorithm.value_map(states), **kwargs)

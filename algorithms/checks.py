"""What an algorithm cannot train on, and what an update must not leave behind: rollouts whose transitions
fail the algorithm's checks, and a loss, gradient norm or weight that is not finite (the online trainer,
``trainer/online.py``, quarantines the first and undoes the second)."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from spanrl.algorithms.tables import check_transitions
from spanrl.errors import ConfigError

__all__ = ["checked_transitions", "nonfinite"]

_logger = logging.getLogger("spanrl.trainer.online")


def checked_transitions(algorithm: Any, transitions: list[Any]) -> tuple[list[Any], dict[str, str]]:
    """The transitions of rollouts that pass the algorithm's checks (``check_transitions``, one rollout at
    a time, e.g. a forged token id outside the vocabulary), and ``bad_transitions`` marks for the rest."""
    model = getattr(algorithm, "model", None)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    by_rollout: dict[str, list[Any]] = {}
    for t in transitions:
        by_rollout.setdefault(t.rollout_id, []).append(t)
    kept, marks = [], {}
    for rollout_id, items in by_rollout.items():
        try:  # the advantage is set later: checked here with a placeholder
            check_transitions([dataclasses.replace(t, advantage=0.0) for t in items], vocab_size=vocab)
        except ConfigError as exc:
            _logger.warning("spanrl online: rollout %s quarantined (bad_transitions): %s", rollout_id, exc)
            marks[rollout_id] = "bad_transitions"
            continue
        kept.extend(items)
    return kept, marks


def nonfinite(algorithm: Any, metrics: dict[str, Any]) -> str | None:
    """What was not finite after an update (a loss, the gradient norm, a weight), or None."""
    import torch

    for key, value in metrics.items():
        watched = key.startswith(("losses/", "charts/grad_norm"))
        if watched and isinstance(value, float) and not math.isfinite(value):
            return f"{key} = {value}"
    model = getattr(algorithm, "model", None)  # the live model (a LoRA one unmerged: no copy)
    weights = model.state_dict() if model is not None else algorithm.policy_weights()
    for name, tensor in weights.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"weight {name} is not finite"
    return None

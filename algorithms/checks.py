"""What an algorithm cannot train on: rollouts whose transitions fail the algorithm's checks (the online
trainer, ``trainer/online.py``, quarantines them). A non-finite update: ``trainer/reporting.py``'s
``NonFiniteGuard``, both trainers' one policy."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from spanrl.algorithms.tables import check_transitions
from spanrl.errors import ConfigError

__all__ = ["checked_transitions"]

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

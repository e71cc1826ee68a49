"""What an algorithm cannot train on: rollouts whose transitions fail the algorithm's checks (the online
trainer, ``online/trainer.py``, quarantines them). A non-finite update: ``trainer/reporting.py``'s
``NonFiniteGuard``, both trainers' one policy."""

from __future__ import annotations

import logging
from typing import Any

import pyarrow.compute as pc

from spanrl.algorithms.tables import check_transitions, transition_table
from spanrl.errors import ConfigError

__all__ = ["bad_rollouts"]

_logger = logging.getLogger("spanrl.online")


def bad_rollouts(algorithm: Any, transitions: Any) -> dict[str, str]:
    """``bad_transitions`` marks for the rollouts whose transitions (a batch or table, columnar) fail the algorithm's
    checks (``check_transitions``, e.g. a forged token id outside the vocabulary); empty when all pass (one check)."""
    model = getattr(algorithm, "model", None)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    table = transition_table(transitions)
    try:
        check_transitions(table, vocab_size=vocab)
        return {}
    except ConfigError:
        pass  # which rollouts: one check each
    marks = {}
    ids = table.column("rollout_id")
    for rollout_id in pc.unique(ids).to_pylist():
        try:
            check_transitions(table.filter(pc.equal(ids, rollout_id)), vocab_size=vocab)
        except ConfigError as exc:
            _logger.warning("spanrl online: rollout %s quarantined (bad_transitions): %s", rollout_id, exc)
            marks[rollout_id] = "bad_transitions"
    return marks

"""The collector's retention: spans older than ``retention_s`` by the collector's own clock are deleted
in the background.

A daemon thread runs `spanrl.store.prune` (one transaction on its own cursor, like ``POST /v1/prune``) every
``interval_s`` and forgets the rollout claims of what it deleted: whole rollouts whose last span was
*ingested* more than ``retention_s`` ago, and rollout-less spans ingested before then. Ingest time, not the
sender's ``end_ns``: a span stamped far in the future is pruned like any other. It never holds the writer.
Errors are logged, never fatal (`collector.periodic`).
"""

from __future__ import annotations

import logging
import time

from spanrl.collector.periodic import PeriodicWorker
from spanrl.collector.sender import RolloutClaims
from spanrl.store import SpanStore
from spanrl.store.maintenance import prune

__all__ = ["Retention", "prune_and_forget", "retention_interval_s"]

_logger = logging.getLogger(__name__)
_MAX_INTERVAL_S = 600.0
_MIN_INTERVAL_S = 0.5


def prune_and_forget(store: SpanStore, older_than_s: float, claims: RolloutClaims | None) -> int:
    """`prune`, then forget the rollout claims of what it deleted. Returns the number of spans deleted."""
    started = time.monotonic()
    deleted = prune(store, older_than_s)
    if claims is not None and deleted:
        claims.forget_pruned(store, started)
    return deleted


def retention_interval_s(retention_s: float) -> float:
    """How often retention runs: a tenth of the retention, between 0.5 s and 10 minutes."""
    return min(max(retention_s / 10.0, _MIN_INTERVAL_S), _MAX_INTERVAL_S)


class Retention(PeriodicWorker):
    """Runs `prune(store, retention_s)` in a daemon thread every ``interval_s``."""

    def __init__(self, store: SpanStore, *, retention_s: float, interval_s: float | None = None,
                 claims: RolloutClaims | None = None) -> None:
        super().__init__(name="spanrl-retention",
                         interval_s=retention_interval_s(retention_s) if interval_s is None else interval_s,
                         doing=f"retention: pruning spans older than {retention_s:.0f} s")
        self._store = store
        self._claims = claims
        self._retention_s = retention_s
        self.deleted_spans = 0
        """Spans deleted since start."""

    def run_once(self) -> None:
        deleted = prune_and_forget(self._store, self._retention_s, self._claims)
        self.deleted_spans += deleted
        if deleted:
            _logger.info("retention: deleted %d spans ingested over %.0f s ago", deleted, self._retention_s)

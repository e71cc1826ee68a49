"""The collector's background materializer: keeps the decomposition of finished rollouts in the store.

A daemon thread runs `spanrl.store.kept_rollouts.materialize` (one transaction on its own cursor) when a
rollout may have finished since its last run: a ``spanrl.rollout`` / ``spanrl.rollout.end`` span was
stored after its cursor (the newest ``ingested_ns`` it saw; a zone-map-pruned scan of the new rows), or
spans came and a rollout may have gone quiet since (views.sql's ``rollout_quiet_ns()``, read in the same
query). It never holds the writer: acknowledgements still follow their commit, and DuckDB lets both
transactions run at once (they write different tables). Adaptive: it waits at least ``interval_s`` and
``_BUSY_FACTOR`` times its last run, so it takes at most ~5% of the time however large the store.
Errors are logged, never fatal (`collector.periodic`).
"""

from __future__ import annotations

import logging
import math
import time

from spanrl import semconv as sc
from spanrl.collector.periodic import PeriodicWorker
from spanrl.store import SpanStore
from spanrl.store.kept_rollouts import materialize

__all__ = ["Materializer"]

_logger = logging.getLogger(__name__)

_BUSY_FACTOR = 19.0  # wait >= 19x the last run: the thread takes <= 5% of the time (bench/ingest.py)
# quiet_s: views.sql's rollout_quiet_ns(), after which a rollout without an end span has finished
_NEW_SPANS = f"""SELECT max(ingested_ns) AS newest,
       bool_or(name IN ('{sc.ROLLOUT_SPAN_NAME}', '{sc.ROLLOUT_END_SPAN_NAME}')) AS ended,
       rollout_quiet_ns() / 1e9 AS quiet_s
FROM spans WHERE ingested_ns > $cursor"""


class Materializer(PeriodicWorker):
    """Runs `materialize` on ``store`` in a daemon thread; ``interval_s``: the shortest wait between runs."""

    def __init__(self, store: SpanStore, *, interval_s: float) -> None:
        super().__init__(name="spanrl-materializer", interval_s=interval_s, busy_factor=_BUSY_FACTOR,
                         doing="materializing decomposed rollouts")
        self._store = store
        self._cursor = -1  # newest ingested_ns seen by the last check
        self._last_run = time.monotonic()
        self._seen_at = -math.inf  # when the cursor last moved

    def run_once(self) -> None:
        started = time.monotonic()
        if self._due():
            done = materialize(self._store)
            self._last_run = started
            if done["rollouts_kept"]:
                _logger.debug("kept %d decomposed rollouts in %.3f s", done["rollouts_kept"],
                              time.monotonic() - started)

    def _due(self) -> bool:
        """Whether a rollout may have finished since the last run: an end span came (moves the cursor),
        or spans came within the quiet time before the last run and it is that long ago."""
        row = self._store.sql(_NEW_SPANS, {"cursor": self._cursor}).to_pylist()[0]
        now = time.monotonic()
        if row["newest"] is not None:
            self._cursor, self._seen_at = row["newest"], now
            if row["ended"]:
                return True
        quiet_s = row["quiet_s"]
        return now - self._last_run >= quiet_s and self._seen_at >= self._last_run - quiet_s

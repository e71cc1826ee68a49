"""The collector's background upkeep threads (the materializer, retention): one shape for both.

A `PeriodicWorker` runs `run_once` in a daemon thread, first after ``interval_s`` and then after
``max(interval_s, busy_factor x its last run)`` (a worker whose run grows with the store keeps to a share of
the time), until `shutdown`. A run's error is logged (its first line) and the next run tries again: the
store may be reopening or closing. It never holds the writer: each run is its own transaction.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["PeriodicWorker"]


class PeriodicWorker:
    """A daemon thread named ``name`` calling `run_once` every ``interval_s`` (see the module docstring);
    ``doing`` says what a run does, for the warning when one fails."""

    def __init__(self, *, name: str, interval_s: float, doing: str, busy_factor: float = 0.0) -> None:
        self._interval_s = interval_s
        self._busy_factor = busy_factor
        self._doing = doing
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def run_once(self) -> None:
        """One run (the subclass's job)."""
        raise NotImplementedError

    def start(self) -> "PeriodicWorker":
        self._thread.start()
        return self

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the thread (after the run in progress). Safe before start or twice."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        wait_s = self._interval_s
        while not self._stop.wait(wait_s):
            started = time.monotonic()
            try:
                self.run_once()
            except Exception as exc:  # the store may be reopening or closing: try again next time
                logging.getLogger(type(self).__module__).warning("%s failed: %s", self._doing,
                                                                 str(exc).splitlines()[0])
            wait_s = max(self._interval_s, self._busy_factor * (time.monotonic() - started))
